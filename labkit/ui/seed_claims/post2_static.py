"""Claims of the second post about the two micro-batching paths and the static one: its divisibility, its row
counts, its padding (claims p2-14 to p2-19). Lengths are the gsm8k-like profile (720 rows, seed 0).
"""

from __future__ import annotations

from labkit.balance.balance_batch import calculate_workload, get_seqlen_balanced_partitions
from labkit.balance.micro_batches import plan_dp_micro_batches, static_micro_batches
from labkit.rules.catalogue import message
from labkit.ui.seed_claims.probe import (
    BUDGET,
    DYN,
    GSM,
    LEGACY,
    PROFILE,
    V1,
    config,
    lengths,
    per_rank,
    rank_lengths,
    trace,
)
from labkit.ui.seed_claims.record import Case, Checked, claim

GROUP = "two paths, and static micro-batches (post 2)"
BOTH = (LEGACY, V1)


def _runs(tr, stage: str, rank: int = 0) -> bool:
    """Whether every micro-batch of a rank is a consecutive slice of the rows the rank holds, in its order."""
    order = tr.at("balance")[rank].extra["indices"]
    flat = [i for m in tr.at(stage)[rank].micro_batches for i in m.indices]
    return flat == list(order)


@claim("p2-14", GROUP, "F3", "0.6–0.8, 0.9.1 v1")
def two_paths_static_unbalanced() -> Checked:
    """use_dynamic_bsz picks one of two micro-batching paths; the static one cuts a fixed number of rows and does
    no balancing."""
    cases = []
    for v in BOTH:
        static, dyn = trace(v, lengths=GSM), trace(v, *DYN, lengths=GSM)
        cases.append(
            Case(
                "static micro-batches are consecutive slices of the rank's rows", True, _runs(static, "old_log_prob"), v
            )
        )
        cases.append(
            Case(
                "dynamic micro-batches differ from the static ones",
                True,
                [m.indices for m in static.at("old_log_prob")[0].micro_batches]
                != [m.indices for m in dyn.at("old_log_prob")[0].micro_batches],
                v,
            )
        )
        order = static.at("balance")[0].extra["indices"]
        cases.append(
            Case(
                "the rows a rank slices are its consecutive chunk of generation order",
                True,
                order == list(range(len(order))),
                v,
                caveat=True,
            )
        )
    return cases, ["_balance_batch has already chosen and ordered the rows of each rank before the static slicing"]


@claim("p2-15", GROUP, "F3", "0.6–0.8, 0.9.1 v1")
def two_kk_layers() -> Checked:
    """Two Karmarkar-Karp layers: _balance_batch across the DP ranks (trainer.balance_batch, on by default), and
    with use_dynamic_bsz the micro-batches inside each rank."""
    cases = []
    lens = lengths(LEGACY, GSM)
    for v in BOTH:
        tr = trace(v, *DYN, lengths=GSM)
        ranks = [sorted(r.extra["indices"]) for r in tr.at("balance")]
        kk = get_seqlen_balanced_partitions(calculate_workload(lens), len(ranks), equal_size=True)
        cases.append(Case("trainer.balance_batch default", True, config(v).get("trainer.balance_batch"), v))
        cases.append(
            Case(
                "the DP partitions are the equal-size KK over the workloads",
                True,
                sorted(map(sorted, kk)) == sorted(ranks),
                v,
            )
        )
        per = rank_lengths(v, GSM, *DYN)
        plans = plan_dp_micro_batches(per, BUDGET, profile=PROFILE[v], max_seq_len=1024 if v == LEGACY else None)
        planned = [[m.tokens for m in r.micro_batches] for r in tr.at("old_log_prob")]
        cases.append(
            Case(
                "each rank's micro-batches are the KK buckets of rearrange_micro_batches",
                True,
                [p.tokens for p in plans] == planned,
                v,
            )
        )
    return cases


@claim("p2-16", GROUP, "E30", "0.6–0.8, 0.9.1 v1")
def static_asserts_divisible() -> Checked:
    """The static path asserts that the rows divide by force_group_size × micro_batch_size_per_gpu and cuts
    rows / (micro_batch_size_per_gpu × force_group_size) chunks."""
    cases = []
    for v in BOTH:
        for m in (8, 7):
            try:
                parts = static_micro_batches(120, m, profile=PROFILE[v])
                seen = f"{len(parts)} micro-batches of {sorted({len(p) for p in parts})} rows"
            except AssertionError as exc:
                seen = f"AssertionError: {exc}"
            want = f"{120 // m} micro-batches of [{m}] rows" if 120 % m == 0 else f"AssertionError: {message('E30')}"
            cases.append(Case(f"120 rows, micro {m}", want, seen, v))
    return cases


@claim("p2-17", GROUP, "E30", "0.6–0.8, 0.9.1 v1")
def static_exact_rows() -> Checked:
    """Every static micro-batch holds exactly micro_batch_size_per_gpu rows, whatever their lengths."""
    cases = []
    for v in BOTH:
        for m in (8, 7):
            try:
                sizes = sorted({len(p) for p in static_micro_batches(120, m, profile=PROFILE[v])})
            except AssertionError:
                sizes = []  # verl refuses: no micro-batch of another size ever runs
            cases.append(
                Case(
                    f"row counts of the micro-batches that run (120 rows, micro {m})",
                    [m],
                    sizes,
                    v,
                    match=lambda c, o: set(o) <= set(c),
                )
            )
    return cases


@claim("p2-18", GROUP, "E30", "0.6–0.8, 0.9.1 v1")
def static_same_count() -> Checked:
    """With static micro-batches every DP rank naturally runs the same number of micro-batches."""
    cases = []
    for v in BOTH:
        tr = trace(v, lengths=GSM)
        for stage in ("old_log_prob", "update_actor"):
            cases.append(
                Case(
                    f"{stage}: distinct micro-batch counts over the ranks",
                    1,
                    len(set(per_rank(tr, stage, "n_micro"))),
                    v,
                )
            )
    return cases


@claim("p2-19", GROUP, "F10", "0.6–0.8, 0.9.1 v1")
def static_pads_to_longest() -> Checked:
    """Static micro-batching wastes compute: short rows are padded to the longest row of the micro-batch."""
    cases, notes = [], []
    lens = lengths(LEGACY, GSM)
    for v in BOTH:
        for rm in ("true", "false"):
            tr = trace(v, f"actor_rollout_ref.model.use_remove_padding={rm}", lengths=GSM)
            micros = tr.at("old_log_prob")[0].micro_batches
            to_longest = all(m.padded_tokens == m.rows * max(lens[i] for i in m.indices) for m in micros)
            cases.append(
                Case(f"use_remove_padding={rm}: every micro-batch padded to its longest row", True, to_longest, v)
            )
            m = micros[0]
            notes.append(
                f"[{v}] rmpad={rm}: first micro-batch {m.rows} rows, {m.tokens} real tokens, "
                f"{m.padded_tokens} through the forward (longest row {max(lens[i] for i in m.indices)}, "
                f"width {tr.summary['width']})"
            )
    return cases, notes
