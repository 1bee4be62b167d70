"""Claims of the second post about how a batch flows from the whole step to one GPU under TP, SP and DP: the
dispatch modes, the worker's normalisation, its meshes, the repeat on the driver, and the per-GPU rows of rollout
and actor (claims p2-01 to p2-09).
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.rules.failures import StageFailure
from labkit.rules.mini_batches import legacy_mini
from labkit.ui.seed_claims.probe import LEGACY, OLD, REF, V1, A, R, micro_rows, report, trace
from labkit.ui.seed_claims.record import Case, Checked, Unknown, claim

GROUP = "from the step to one GPU (post 2)"
# 64 prompts, n=12 on 8 GPUs with Ulysses sp=2: 768 samples, D = 4 DP groups of 2 GPUs
SP2 = (
    "trainer.n_gpus_per_node=8",
    "data.train_batch_size=64",
    f"{A}.ppo_mini_batch_size=64",
    f"{A}.ulysses_sequence_parallel_size=2",
    f"{REF}.ulysses_sequence_parallel_size=2",
)
SP2_ROWS_IN, SP2_ROWS = 64 * 12 // 8, 64 * 12 * 2 // 8  # B·n/W and B·n·sp/W


def _rows_in(rec) -> int:
    return rec.extra.get("rows_in", rec.rows)


@claim("p2-01", GROUP, "F6", "≤0.5, 0.6–0.8")
def dp_compute_proto() -> Checked:
    """The FSDP workers dispatch with DP_COMPUTE_PROTO, which is only right when every GPU is its own DP rank; with
    rollout TP or Ulysses SP the data needs a pre- and post-processing step, all_gather_data_proto."""
    cases = []
    for v in (OLD, LEGACY):
        tr = trace(v, *SP2)
        for stage, group in (("generate", "TP"), ("old_log_prob", "SP")):
            rec = tr.at(stage)[1]
            seen = (_rows_in(rec), rec.rows, "all_gather(data_proto)" in rec.collectives)
            cases.append(
                Case(
                    f"{stage} ({group} group): rows in, rows computed on, group all-gather",
                    (SP2_ROWS_IN, SP2_ROWS, True),
                    seen,
                    v,
                )
            )
    return cases


@claim("p2-02", GROUP, "F6", "≤0.5, 0.6–0.8")
def tp_all_gather() -> Checked:
    """With rollout TP the ranks of a TP group all-gather their inputs so each holds the same data, and split the
    outputs back to their own part."""
    cases = []
    for v in (OLD, LEGACY):
        rec = trace(v).at("generate")[1]
        seen = (_rows_in(rec), rec.rows, rec.extra["rows_out"])
        cases.append(Case("a TP rank's rows in, generated on, returned", (120, 240, 120), seen, v))
    rec = trace(LEGACY).at("generate")
    return cases, [
        f"[{LEGACY}] rows returned by TP ranks 0 and 1: {rec[0].extra['rows_out']}, {rec[1].extra['rows_out']}"
    ]


@claim("p2-03", GROUP, "F6", "≤0.5, 0.6–0.8")
def sp_all_gather() -> Checked:
    """With Ulysses SP the ranks of an SP group do the same: all-gather the inputs so every SP rank holds the same
    rows, and split the outputs back."""
    cases = []
    for v in (OLD, LEGACY):
        rec = trace(v, *SP2).at("old_log_prob")[1]
        seen = (_rows_in(rec), rec.rows, rec.collectives.get("all_gather(data_proto)", 0))
        cases.append(Case("an SP rank's rows in, computed on, data all-gathers", (SP2_ROWS_IN, SP2_ROWS, 1), seen, v))
    return cases


def _quoted_block(M: int, n: int, W: int, sp: int, micro: int | None) -> int | str:
    """The normalisation as the post quotes it from fsdp_workers.py, transcribed: the mini-batch or the assert."""
    mini = M * n // (W // sp)
    if not mini > 0:
        return f"ppo_mini_batch_size {mini} should be larger than 0 after normalization"
    if micro is not None:
        if mini % micro != 0:
            return f"normalized ppo_mini_batch_size {mini} should be divisible by ppo_micro_batch_size_per_gpu {micro}"
        if not mini // micro > 0:
            return f"normalized ppo_mini_batch_size {mini} should be larger than ppo_micro_batch_size_per_gpu {micro}"
    return mini


def _labkit_mini(M: int, n: int, W: int, sp: int, micro: int | None) -> int | str:
    try:
        return legacy_mini(M, n, W, sp, micro)
    except StageFailure as fail:
        return fail.message


@claim("p2-04", GROUP, "E20", "0.6–0.8")
def quoted_normalisation() -> Checked:
    """The worker's normalisation block, as quoted: mini-batch × n, floor-divided by world_size // sp, asserted
    > 0; the per-GPU micro-batch must divide it and be no larger; the deprecated global micro sizes (actor,
    rollout and ref log-prob) are floor-divided by world_size // sp."""
    grid = [
        (M, n, W, sp, m)
        for M in (1, 8, 25, 60)
        for n in (1, 5, 12)
        for W in (4, 6, 8)
        for sp in (1, 2)
        for m in (None, 1, 3, 8)
        if W % sp == 0
    ]
    agree = sum(_quoted_block(*g) == _labkit_mini(*g) for g in grid)
    dep = micro_rows(
        trace(LEGACY, f"~{R}.log_prob_micro_batch_size_per_gpu", f"{R}.log_prob_micro_batch_size=48"), "old_log_prob"
    )[0]
    cases = [
        Case(
            f"configurations where the quoted block and labkit's legacy rule agree (of {len(grid)})", len(grid), agree
        ),
        Case("deprecated log_prob_micro_batch_size=48 on 6 GPUs: rows per micro-batch", 48 // 6, dep),
    ]
    return cases, [report(LEGACY).arithmetic("E20")[0] if report(LEGACY).arithmetic("E20") else ""]


@claim("p2-05", GROUP, "F13", "≤0.5, 0.6–0.8")
def three_meshes() -> Checked:
    """The worker builds an FSDP mesh (dp), a Ulysses mesh (dp, sp) and, for the rollout, a (dp, tp) mesh."""
    cases = []
    for v in (OLD, LEGACY):
        s = trace(v, *SP2).summary
        cases.append(Case("Ulysses mesh (dp, sp)", (4, 2), (s["D"], s["sp"]), v))
        cases.append(Case("rollout mesh dimensions", ["dp", "infer_tp"], s["rollout_mesh"]["dims"], v))
    s = trace(LEGACY, *SP2).summary
    notes = [
        message("F13", name="Ulysses", dims="dp, sp", shape=(s["D"], s["sp"])),
        message(
            "F13",
            name="rollout",
            dims=", ".join(s["rollout_mesh"]["dims"]),
            shape=tuple(s["rollout_mesh"][d] for d in s["rollout_mesh"]["dims"]),
        ),
    ]
    return cases, notes


@claim("p2-06", GROUP, "F1", "≤0.5")
def driver_repeats_first() -> Checked:
    """In verl v0.5.0 the driver repeats the prompts n times before dispatching them, instead of the workers
    repeating after the dispatch."""
    names = trace(OLD).stage_names()
    cases = [
        Case(
            "the repeat stage comes before generation",
            True,
            "repeat" in names and names.index("repeat") < names.index("generate"),
            OLD,
        )
    ]
    notes = [
        trace(OLD).stage("repeat").note,
        f"[{LEGACY}] stages: {' → '.join(trace(LEGACY).stage_names()[:4])}",
        f"[{V1}] stages: {' → '.join(trace(V1).stage_names()[:3])} (no driver-side repeat)",
    ]
    return cases, notes


@claim("p2-07", GROUP, "E26", "≤0.5")
def why_repeat_first() -> Checked:
    """The reason for repeating first: a batch smaller than the world size could not be split over the GPUs."""
    four = ("data.train_batch_size=4", "trainer.n_gpus_per_node=8", f"{A}.ppo_mini_batch_size=4")
    alone = trace(OLD, *four, f"{R}.n=1").summary["stage_errors"].get("generate")  # 4 rows reach the dispatch
    first = trace(OLD, *four, f"{R}.n=4").summary["stage_errors"].get("generate")  # 16 rows, repeated first
    cases = [
        Case("4 prompts dispatched over 8 GPUs, one chunk per GPU", "fails", "fails" if alone else "splits", OLD),
        Case(
            "the 4 prompts repeated n=4 first (16 rows), then dispatched", "splits", "fails" if first else "splits", OLD
        ),
        Case("this is why verl repeats first", True, Unknown("a design reason; verl's code does not state it")),
    ]
    return cases, [f"4 rows over 8 GPUs: {alone['message']}" if alone else "4 rows split"]


@claim("p2-08", GROUP, "F6", "≤0.5, 0.6–0.8")
def rollout_rows_per_gpu() -> Checked:
    """A rollout GPU receives B·n/world_size rows, pre-processes them to B·n·tp/world_size, generates, and
    post-processes back to B·n/world_size."""
    cases = []
    for v in (OLD, LEGACY):
        rec = trace(v).at("generate")[0]
        seen = (_rows_in(rec), rec.rows, rec.extra["rows_out"])
        cases.append(Case("rows in, generated on, returned", (720 // 6, 720 * 2 // 6, 720 // 6), seen, v))
    return cases


@claim("p2-09", GROUP, "F6", "≤0.5, 0.6–0.8")
def actor_rows_per_gpu() -> Checked:
    """An actor GPU receives B·n/world_size rows and pre-processes them to B·n·sp/world_size, the normalised
    mini-batch when ppo_mini_batch_size = train_batch_size."""
    cases = []
    for v in (OLD, LEGACY):
        tr = trace(v, *SP2)
        rec = tr.at("update_actor")[1]
        seen = (_rows_in(tr.at("old_log_prob")[1]), rec.rows, rec.mini_batches[0])
        cases.append(
            Case("rows in, rows after the SP gather, mini-batch rows", (SP2_ROWS_IN, SP2_ROWS, SP2_ROWS), seen, v)
        )
    return cases
