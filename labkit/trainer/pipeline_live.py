"""A live pipeline step on CPU ranks, predicted first and then observed: the schedule, in-flight micro-batches and
activation bytes of every stage, and the collectives of every rank.

The prediction is the planner's: megatron-core's order of forwards and backwards per stage
(``labkit.plan.pipeline_schedule.pipeline_schedule``), the micro-batches each stage keeps in flight, and the bytes
they hold: the in-flight (micro-batch, chunk) pairs after every action times one micro-batch's saved activations per
chunk (``labkit.model.pipeline_model.chunk_activation_bytes``, measured once in the driver on one process). The
observation is what each rank of ``labkit.model.pipeline_worker.PipelineWorker`` did: the order it ran, the saved
tensors autograd kept alive after each action, its P2P and DP collectives. ``LivePipeline.mismatches`` lists every
disagreement; activations must agree within ``BYTES_TOLERANCE``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.model.pipeline_model import chunk_activation_bytes
from labkit.model.pipeline_run import (
    NUM_LAYERS,
    open_group,
    pipeline_spec,
    predicted_counts,
    predicted_held,
    run_spec,
)
from labkit.model.pipeline_worker import STAGE, pipeline_layout
from labkit.plan.pipeline_schedule import PipelineSchedule, pipeline_schedule
from labkit.rules.parallel_layout import ParallelLayout
from labkit.runtime.worker_group import WorkerGroup
from labkit.trace import MicroBatchRecord, RankRecord, StepTrace

__all__ = ["BYTES_TOLERANCE", "NUM_LAYERS", "LivePipeline", "StageView", "live_pipeline", "side_by_side", "open_group",
           "pipeline_spec", "predicted_counts", "predicted_held", "run_spec"]  # fmt: skip

BYTES_TOLERANCE = 0.0
"""Measured / predicted peak activation bytes per stage must lie within 1 ± this: 0, they are equal. The ranks run
the same ops on the same shapes as the driver's one-forward measurement, so autograd saves the same tensors; any
difference is a finding, not noise."""


@dataclass
class StageView:
    """One rank's stage, predicted and observed."""

    rank: int
    stage: int
    dp_rank: int
    predicted_actions: list[tuple[str, int, int]]
    observed_actions: list[tuple[str, int, int]]
    predicted_in_flight: list[int]
    """Chunk-forwards alive after each predicted action."""
    observed_in_flight: list[int]
    predicted_bytes: list[int]
    """Saved activation bytes alive after each action."""
    observed_bytes: list[int]
    predicted_counts: dict[str, int]
    observed_counts: dict[str, int]
    timeline: list[dict[str, Any]] = field(default_factory=list)
    """Observed actions with start/end seconds from the step's start."""

    @property
    def predicted_peak_bytes(self) -> int:
        return max(self.predicted_bytes, default=0)

    @property
    def observed_peak_bytes(self) -> int:
        return max(self.observed_bytes, default=0)

    @property
    def bytes_ratio(self) -> float:
        return self.observed_peak_bytes / self.predicted_peak_bytes if self.predicted_peak_bytes else float("nan")


@dataclass
class LivePipeline:
    """A live step next to its prediction: the layout, the planned schedule, one StageView per rank."""

    layout: ParallelLayout
    schedule: PipelineSchedule
    units: list[int]
    """Saved bytes of one micro-batch per virtual stage (the prediction's unit)."""
    stages: list[StageView]
    results: list[dict[str, Any]]
    elapsed_s: float
    left_pids: list[int] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    """What every rank was given (``labkit.model.pipeline_run.pipeline_spec``)."""

    def mismatches(self) -> list[str]:
        """Every disagreement between prediction and observation, one line each (empty: they agree)."""
        out = []
        for r in self.results:
            if r["outcome"] != "ok":
                out.append(f"rank {r['rank']}: {r['outcome']}: {r['error']}")
        for s in self.stages:
            who = f"rank {s.rank} (stage {s.stage}, dp {s.dp_rank})"
            if s.observed_actions != s.predicted_actions:
                out.append(f"{who}: order {s.observed_actions} != planned {s.predicted_actions}")
            if s.observed_in_flight != s.predicted_in_flight:
                out.append(f"{who}: in flight {s.observed_in_flight} != planned {s.predicted_in_flight}")
            if not abs(s.bytes_ratio - 1) <= BYTES_TOLERANCE:
                out.append(f"{who}: peak activations {s.observed_peak_bytes} vs {s.predicted_peak_bytes} predicted")
            elif not BYTES_TOLERANCE and s.observed_bytes != s.predicted_bytes:  # exact: after every action too
                out.append(f"{who}: activations after each action {s.observed_bytes} != planned {s.predicted_bytes}")
            if s.observed_counts != s.predicted_counts:
                out.append(f"{who}: collectives {s.observed_counts} != planned {s.predicted_counts}")
        return out

    def traces(self) -> tuple[StepTrace, StepTrace]:
        """(plan, live run) as ``labkit.trace.StepTrace``s of the ``update_actor`` stage, one RankRecord per rank:
        micro-batches, collectives, peak activation bytes, the Megatron coordinates and, in ``extra``, the order of
        actions and the chunk-forwards in flight after each; ``labkit.trace.compare`` holds the counts to each other."""
        out = []
        for source in ("plan", "live"):
            trace = StepTrace("engine", source)
            for s, r in zip(self.stages, sorted(self.results, key=lambda r: r["rank"])):
                plan_side = source == "plan"
                m = self.schedule.num_microbatches if plan_side else r["micro_batches"]
                rows, seq = self.spec["rows"], self.spec["seq_len"]
                trace.ranks.append(
                    RankRecord(
                        STAGE, s.rank, s.dp_rank, rows=rows * m, tokens=rows * seq * m,
                        micro_batches=[MicroBatchRecord(rows, rows * seq) for _ in range(m)],
                        collectives=dict(s.predicted_counts if plan_side else s.observed_counts),
                        bytes_predicted=s.predicted_peak_bytes, bytes_measured=None if plan_side else s.observed_peak_bytes,
                        extra={"megatron": {"tp": 0, "cp": 0, "dp": s.dp_rank, "pp": s.stage},
                               "actions": s.predicted_actions if plan_side else s.observed_actions,
                               "in_flight": s.predicted_in_flight if plan_side else s.observed_in_flight},
                    )
                )  # fmt: skip
            out.append(trace)
        return out[0], out[1]

    def table(self) -> list[dict[str, Any]]:
        """One row per rank: stage, peak in flight and peak bytes predicted vs measured, and their ratio."""
        return [
            {
                "rank": s.rank,
                "stage": s.stage,
                "dp_rank": s.dp_rank,
                "in flight (plan)": max(s.predicted_in_flight, default=0),
                "in flight (run)": max(s.observed_in_flight, default=0),
                "peak MiB (plan)": round(s.predicted_peak_bytes / 2**20, 3),
                "peak MiB (run)": round(s.observed_peak_bytes / 2**20, 3),
                "ratio": round(s.bytes_ratio, 4),
                "order equal": s.observed_actions == s.predicted_actions,
            }
            for s in self.stages
        ]


def live_pipeline(
    pp: int,
    vpp: int | None = None,
    dp: int = 1,
    micro_batches: int = 4,
    rows: int = 2,
    seq_len: int = 32,
    group: WorkerGroup | None = None,
    timeout_s: float = 10.0,
) -> LivePipeline:
    """Predict one training step of a PP·DP pipeline (1F1B, interleaved when ``vpp``), run it on CPU ranks, and
    put both side by side (``LivePipeline.mismatches`` empty when they agree)."""
    spec = pipeline_spec(pp, vpp, dp, micro_batches, rows, seq_len)
    layout = pipeline_layout(pp, vpp, dp)
    schedule = pipeline_schedule(pp, vpp, micro_batches)
    units = chunk_activation_bytes(NUM_LAYERS, pp, vpp, rows, seq_len)
    results, left, elapsed = run_spec(spec, group, timeout_s)
    return side_by_side(layout, schedule, units, results, elapsed, left, spec)


def side_by_side(
    layout: ParallelLayout,
    schedule: PipelineSchedule,
    units: list[int],
    results: list[dict[str, Any]],
    elapsed_s: float,
    left: list[int],
    spec: dict[str, Any] | None = None,
) -> LivePipeline:
    """The StageView of every rank from its record and the prediction."""
    t0 = min((a["t_start"] for r in results for a in r.get("actions", [])), default=0.0)
    views = []
    for r in sorted(results, key=lambda r: r["rank"]):
        st = schedule.stages[r["pp_stage"]]
        counts, held = predicted_held(st.actions, units, layout.pp, r["pp_stage"])
        acts = r.get("actions", [])
        views.append(
            StageView(
                rank=r["rank"],
                stage=r["pp_stage"],
                dp_rank=r["dp_rank"],
                predicted_actions=list(st.actions),
                observed_actions=[(a["kind"], a["mb"], a["chunk"]) for a in acts],
                predicted_in_flight=counts,
                observed_in_flight=[a["in_flight"] for a in acts],
                predicted_bytes=held,
                observed_bytes=[a["live_bytes"] for a in acts],
                predicted_counts=predicted_counts(schedule, layout, r["pp_stage"]),
                observed_counts=dict(r.get("counts") or {}),
                timeline=[
                    dict(a, start_s=a["t_start"] - t0, compute_s=a["t_compute"] - t0, end_s=a["t_end"] - t0)
                    for a in acts
                ],
            )
        )
    return LivePipeline(layout, schedule, units, views, results, elapsed_s, left, dict(spec or {}))
