"""Claims of the second post about dynamic micro-batching: the token budget × sp, the count and its DP-wide MAX
sync, the Karmarkar-Karp buckets, and why ranks must agree on the count (claims p2-20 to p2-26). Lengths are the
gsm8k-like profile (720 rows, seed 0) or the post's own 8-sample example next to a light rank.
"""

from __future__ import annotations

from labkit.balance.balance_batch import calculate_workload
from labkit.balance.kk import karmarkar_karp
from labkit.balance.micro_batches import plan_dp_micro_batches, rearrange_micro_batches
from labkit.plan.hang_risk import rank_risks, unsynced_counts
from labkit.rules.catalogue import message
from labkit.rules.dp_sync import dp_group_passed, sync_group
from labkit.rules.geometry import ceil_div
from labkit.ui.seed_claims.probe import (
    BUDGET,
    BUDGET8,
    DYN,
    GSM,
    LEGACY,
    PROFILE,
    SEED8,
    V1,
    A,
    per_rank,
    rank_lengths,
    trace,
)
from labkit.ui.seed_claims.record import Case, Checked, claim

GROUP = "dynamic micro-batches (post 2)"
BOTH = (LEGACY, V1)
LIGHT = [800] * 8  # a second rank with few tokens


@claim("p2-20", GROUP, "F7", "0.6–0.8, 0.9.1 v1")
def budget_times_sp() -> Checked:
    """The dynamic token budget is max_token_len_per_gpu × sp, handed to rearrange_micro_batches with the DP group
    and same_micro_num_in_dp."""
    sp2 = (
        "trainer.n_gpus_per_node=8",
        "data.train_batch_size=64",
        f"{A}.ppo_mini_batch_size=64",
        f"{A}.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2",
    )
    cases = []
    for v in BOTH:
        tr = trace(v, *sp2, *DYN, lengths=GSM)
        tokens = [sum(r) for r in rank_lengths(v, GSM, *sp2, *DYN)]
        want = max(ceil_div(t, BUDGET * 2) for t in tokens)
        cases.append(
            Case(
                f"log-prob micro-batches per DP rank (budget {BUDGET} × sp 2)",
                [want],
                sorted(set(per_rank(tr, "old_log_prob", "n_micro"))),
                v,
            )
        )
        cases.append(
            Case(
                "the count is MAX all-reduced",
                True,
                "all_reduce(max):num_micro_batches" in tr.at("old_log_prob")[0].collectives,
                v,
            )
        )
    return cases


@claim("p2-21", GROUP, "F7", "0.6–0.8, 0.9.1 v1")
def count_is_ceil() -> Checked:
    """The number of micro-batches is ceil(attention_mask.sum() / max_token_len)."""
    cases = []
    for v in BOTH:
        p = PROFILE[v]
        alone = rearrange_micro_batches(SEED8, BUDGET8, profile=p).num_micro_batches
        cases.append(
            Case("the 8-sample example alone (33,000 tokens, budget 13,312)", ceil_div(sum(SEED8), BUDGET8), alone, v)
        )
        light = plan_dp_micro_batches([SEED8, LIGHT], BUDGET8, profile=p)[1].num_micro_batches
        cases.append(
            Case(
                "a light rank (6,400 tokens) next to it, after the DP MAX",
                ceil_div(sum(LIGHT), BUDGET8),
                light,
                v,
                caveat=True,
            )
        )
        grown = rearrange_micro_batches([6000, 6000, 6000, 1000], 10000, profile=p).num_micro_batches
        cases.append(
            Case(
                "19,000 tokens in rows of 6000, 6000, 6000, 1000, budget 10,000",
                ceil_div(19000, 10000),
                grown,
                v,
                caveat=True,
            )
        )
    return cases, [message("F7", tokens=sum(LIGHT), budget=BUDGET8, k=1, synced=3)]


@claim("p2-22", GROUP, "F7", "0.6–0.8, 0.9.1 v1")
def sync_needs_dp_group() -> Checked:
    """The MAX all-reduce runs only when torch.distributed is initialised, same_micro_num_in_dp is set and a
    dp_group is given."""
    cases = []
    for v in BOTH:
        p = PROFILE[v]
        cases.append(Case("dp_group=None: the count is synced over", None, sync_group(p, False), v))
        cases.append(Case("a dp_group given: synced over", "dp", sync_group(p, True), v))
        cases.append(Case("torch.distributed not initialised: synced", None, sync_group(p, True, False), v))
    notes = [
        f"[{v}] the caller passes a DP group: {dp_group_passed(PROFILE[v])}, so the count is synced over "
        f"{sync_group(PROFILE[v], dp_group_passed(PROFILE[v]))}"
        for v in BOTH
    ]
    return cases, notes


@claim("p2-23", GROUP, "F4", "all versions")
def workload_formula() -> Checked:
    """The workload is 24576·L + L², proportional to the FLOPs 12·h²·L + 2·h·L² of a layer."""
    h = 4096
    ls = [1, 512, 4096, 9000, 32768]
    seen = [w * 2 * h for w in calculate_workload(ls)]
    cases = [Case(f"workload × 2h for L in {ls} (h = {h})", [12 * h * h * x + 2 * h * x * x for x in ls], seen)]
    return cases, [message("F4", length=9000, workload=calculate_workload([9000])[0])]


@claim("p2-24", GROUP, "F7", "0.6–0.8, 0.9.1 v1")
def kk_free_size() -> Checked:
    """The buckets come from karmarkar_karp(workloads, k_partitions=num_micro_batches, equal_size=False)."""
    cases = []
    w = calculate_workload(SEED8)
    kk = sorted(map(sorted, karmarkar_karp(w, 3, equal_size=False)))
    for v in BOTH:
        plan = rearrange_micro_batches(SEED8, BUDGET8, profile=PROFILE[v])
        cases.append(Case("buckets of the 8-sample example", kk, sorted(map(sorted, plan.indices)), v))
    return cases, [f"bucket sizes {sorted(len(b) for b in kk)}: free-size partitions"]


@claim("p2-25", GROUP, "F7", "0.6–0.8")
def no_sync_hangs() -> Checked:
    """Without the MAX all-reduce the ranks cut different numbers of micro-batches, run different numbers of FSDP
    forwards, and the collectives never pair up: an NCCL hang."""
    counts = unsynced_counts([SEED8, LIGHT], BUDGET8, "legacy", None)
    risks = rank_risks([SEED8, LIGHT], BUDGET8, "old_log_prob", "legacy")
    cases = [
        Case("micro-batch counts of a heavy and a light rank without the sync differ", True, len(set(counts)) > 1),
        Case("labkit predicts the unsynced-count hang", True, any(r.kind == "a" for r in risks)),
    ]
    return cases, [f"counts without the sync: {counts}"] + [r.line() for r in risks]


@claim("p2-26", GROUP, "E37", "0.6–0.8, 0.9.1 v1")
def sparse_not_padded() -> Checked:
    """A rank with less work aligns by cutting more, sparser buckets, not by adding dummy padding."""
    cases, notes = [], []
    for v in BOTH:
        heavy, light = plan_dp_micro_batches([SEED8, LIGHT], BUDGET8, profile=PROFILE[v])
        rows = sorted(i for b in light.indices for i in b)
        cases.append(
            Case("light rank: same count as the heavy one", heavy.num_micro_batches, light.num_micro_batches, v)
        )
        cases.append(Case("light rank: its own 8 rows, no row added", list(range(8)), rows, v))
        cases.append(Case("light rank: every bucket holds a real row", True, all(light.indices), v))
        notes.append(f"[{v}] tokens per bucket: heavy {heavy.tokens}, light {light.tokens}")
    return cases, notes
