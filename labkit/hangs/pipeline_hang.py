"""The Megatron pipeline's micro-batch hangs on real CPU ranks (PP = 2 × DP = 2, gloo), each ended by a short
collective timeout and diagnosed rank by rank; and the same step with the fix, whose collectives equal the plan's.

(a) ``unsynced_dynamic_bsz``: dynamic micro-batches cut without the MAX sync over DP
(``verl/utils/seqlen_balancing.py: rearrange_micro_batches`` with ``same_micro_num_in_dp``). Every stage of a DP
rank agrees (they hold the same rows), so each pipeline runs; but a MoE layer's token all-to-all runs per
micro-batch in the expert group, which spans DP ranks: the DP rank with one micro-batch more waits in it.
(b) ``vpp_light_rank``: with virtual pipeline stages, verl asserts the micro-batch count divides by G
(``verl/workers/engine/utils.py: prepare_micro_batches``). A DP rank holding fewer rows (a fork's unequal dispatch)
fails it alone; its peers run their pipeline and wait in the DP gradient reduce.
Every run uses the local launcher and closes its group; ``left_pids`` lists rank processes still alive (none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.balance.micro_batches import plan_dp_micro_batches
from labkit.hangs.diagnosis import Diagnosis, diagnose, timeline
from labkit.model.pipeline_run import pipeline_spec, predicted_counts, run_spec
from labkit.model.pipeline_worker import pipeline_layout
from labkit.plan.pipeline_schedule import pipeline_schedule
from labkit.rules.megatron_ranks import megatron_ranks
from labkit.runtime.worker_group import WorkerGroup

BUDGET = 4096  # max_token_len per GPU (CP = 1)
HEAVY, LIGHT = [3000, 3000, 3000, 1000], [2000, 2000, 2000, 2000]  # dp_rank 0, dp_rank 1: alone 3 and 2
FIX_A = (
    "sync the count over DP: rearrange_micro_batches(..., dp_group=DP, same_micro_num_in_dp=True) all-reduces k "
    "with MAX (verl's engine does; a fork or a custom loop that drops it hangs as soon as a collective spans DP)"
)
FIX_B = (
    "dispatch the same rows to every DP rank (verl's dispatch does) and keep the count a multiple of G: "
    "rows / micro size on the static path, the round-up to G after the MAX sync on the dynamic one"
)


@dataclass
class PipelineHang:
    """One reproduction: the verdict, each rank's record, the collective timeline, what was left behind, the fix."""

    diagnosis: Diagnosis
    results: list[dict[str, Any]]
    events: list[dict[str, Any]]
    elapsed_s: float
    timeout_s: float
    left_pids: list[int]
    micro_batches: list[int]
    fixed_micro_batches: list[int]
    fixed: list[dict[str, Any]] = field(default_factory=list)
    predicted: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def fixed_completed(self) -> bool:
        return bool(self.fixed) and all(r["outcome"] == "ok" for r in self.fixed)

    @property
    def fixed_mismatches(self) -> list[str]:
        """Ranks of the fixed run whose collectives differ from the plan's."""
        seen = {r["rank"]: r["counts"] for r in self.fixed}
        return [f"rank {r}: {seen.get(r)} != planned {p}" for r, p in self.predicted.items() if seen.get(r) != p]


def dynamic_counts(sync: bool, group: int | None = None) -> list[int]:
    """Micro-batches each DP rank cuts from HEAVY and LIGHT under BUDGET (verl 0.9.1's dynamic path), with or
    without the MAX sync; ``group``: G, the round-up of virtual pipeline stages."""
    plans = plan_dp_micro_batches([HEAVY, LIGHT], BUDGET, profile="engine", dp_group=sync, num_batches_divided_by=group)
    return [p.num_micro_batches for p in plans]


def _expected(spec: dict[str, Any]) -> dict[int, dict[str, int]]:
    """Per rank, the collectives of the healthy step (P2P, optimizer, and the expert all-to-all per micro-batch)."""
    layout = pipeline_layout(spec["pp"], spec["vpp"], spec["dp"], spec["ep"])
    coords = megatron_ranks(layout).coords
    out = {}
    for rank in range(layout.world_size):
        stage, dp_rank = int(coords["pp"][rank]), int(coords["dp"][rank])
        m = spec["micro_batches"][dp_rank]
        counts = predicted_counts(pipeline_schedule(spec["pp"], spec["vpp"], m, spec["group_size"]), layout, stage)
        if spec["ep"] > 1:
            chunks = spec["vpp"] or 1
            counts |= {"all_to_all(ep):tokens": m * chunks, "all_to_all(ep):tokens:backward": m * chunks}
        out[rank] = counts
    return out


def _run(
    spec: dict[str, Any], fixed_spec: dict[str, Any], scenario: str, title: str, fix: str, extra: str,
    timeout_s: float, group: WorkerGroup | None,
) -> PipelineHang:  # fmt: skip
    results, left, elapsed = run_spec(spec, None, timeout_s)  # a fresh group: a timed-out one is not reused
    diag = diagnose(scenario, title, results, fix, extra)
    fixed, _, _ = run_spec(fixed_spec, group, timeout_s)
    return PipelineHang(
        diag, results, timeline(results), elapsed, timeout_s, left, spec["micro_batches"],
        fixed_spec["micro_batches"], fixed, _expected(fixed_spec),
    )  # fmt: skip


def unsynced_dynamic_bsz(timeout_s: float = 3.0, group: WorkerGroup | None = None) -> PipelineHang:
    """(a): PP = 2, DP = 2, EP = 2 under 1F1B; dp_rank 0 cuts 3 micro-batches, dp_rank 1 cuts 2 (no MAX sync). The
    fix syncs both to 3. ``group``: an open 4-rank PipelineWorker group for the fixed run (else a new one)."""
    alone, synced = dynamic_counts(False), dynamic_counts(True)
    spec = pipeline_spec(2, None, 2, alone, ep=2)
    extra = f"micro-batches per DP rank without the sync {alone}, with it {synced}"
    title = "dynamic micro-batches without the DP MAX sync, with a MoE all-to-all"
    return _run(spec, pipeline_spec(2, None, 2, synced, ep=2), "a", title, FIX_A, extra, timeout_s, group)


def vpp_light_rank(
    timeout_s: float = 3.0, group: WorkerGroup | None = None, rows: tuple[int, int] = (4, 3)
) -> PipelineHang:
    """(b): PP = 2, VPP = 2 (G = 2), DP = 2, micro size 1; dp_rank 0 holds 4 rows, dp_rank 1 holds 3, whose count
    fails verl's VPP assert. The fix gives both 4 rows."""
    spec = pipeline_spec(2, 2, 2, list(rows))
    fixed = pipeline_spec(2, 2, 2, [max(rows)] * 2)
    extra = f"rows (= micro-batches at micro size 1) per DP rank {list(rows)}, G = 2"
    title = "a DP rank fails the virtual pipeline's divisibility alone"
    return _run(spec, fixed, "b", title, FIX_B, extra, timeout_s, group)


SCENARIOS = {"a": unsynced_dynamic_bsz, "b": vpp_light_rank}
