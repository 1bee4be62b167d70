"""The driver's side of a live pipeline step: what every rank is given (``pipeline_spec``), the group of CPU ranks
that runs it (``open_group``, ``run_spec``), and what the plan says each rank will do: its P2P and DP collectives
(``predicted_counts``) and the chunk-forwards and saved bytes it holds after each action (``predicted_held``).
Shared by the lesson's live step (``labkit.trainer.pipeline_live``) and the pipeline hangs
(``labkit.hangs.pipeline_hang``); the rank's side is ``labkit.model.pipeline_worker``.
"""

from __future__ import annotations

import time
from typing import Any

from labkit.model.pipeline_model import check_pipeline_split
from labkit.model.pipeline_worker import PipelineWorker
from labkit.plan.megatron_passes import optimizer_collectives
from labkit.plan.pipeline_schedule import PipelineSchedule
from labkit.rules.parallel_layout import ParallelLayout
from labkit.runtime.worker_group import WorkerGroup

NUM_LAYERS = 4  # divides by PP = 4 and by PP·VPP = 2·2


def predicted_counts(schedule: PipelineSchedule, layout: ParallelLayout, stage: int) -> dict[str, int]:
    """The collectives one rank of ``stage`` issues: each P2P per (micro-batch, chunk) of the schedule, then the
    optimizer step's (``labkit.plan.megatron_passes.optimizer_collectives``: the DP gradient reduce, the grad norm)."""
    p2p, m = schedule.stages[stage].p2p, schedule.num_microbatches
    counts = {
        "recv(pp):activation": p2p.recv_forward * m,
        "send(pp):activation": p2p.send_forward * m,
        "recv(pp):grad": p2p.recv_backward * m,
        "send(pp):grad": p2p.send_backward * m,
    }
    counts |= optimizer_collectives(layout)
    return {k: v for k, v in counts.items() if v}


def predicted_held(actions: list[tuple[str, int, int]], units: list[int], pp: int, stage: int) -> tuple[list, list]:
    """(chunk-forwards in flight, saved bytes alive) after each action: a forward adds its chunk's unit, the backward
    of the same (micro-batch, chunk) frees it."""
    alive: dict[tuple[int, int], int] = {}
    counts, held = [], []
    for kind, mb, c in actions:
        if kind == "F":
            alive[(mb, c)] = units[c * pp + stage]
        else:
            alive.pop((mb, c), None)
        counts.append(len(alive))
        held.append(sum(alive.values()))
    return counts, held


def pipeline_spec(
    pp: int,
    vpp: int | None = None,
    dp: int = 1,
    micro_batches: int | list[int] = 4,
    rows: int = 2,
    seq_len: int = 32,
    ep: int = 1,
    group_size: int | None = None,
    num_layers: int = NUM_LAYERS,
    seed: int = 0,
) -> dict[str, Any]:
    """What every rank's ``train_step`` gets; ``micro_batches`` per DP rank (one int: the same on every DP rank)."""
    if not (isinstance(pp, int) and pp >= 2):
        raise ValueError(f"the live pipeline needs pipeline_model_parallel_size >= 2, got {pp!r}")
    check_pipeline_split(num_layers, pp, vpp)
    counts = [micro_batches] * dp if isinstance(micro_batches, int) else list(micro_batches)
    if len(counts) != dp or any(not isinstance(c, int) or c < 1 for c in counts):
        raise ValueError(f"micro_batches needs one positive count per DP rank ({dp}), got {micro_batches!r}")
    return dict(pp=pp, vpp=vpp, dp=dp, ep=ep, num_layers=num_layers, rows=rows, seq_len=seq_len,
                micro_batches=counts, group_size=group_size, seed=seed)  # fmt: skip


def open_group(world_size: int, timeout_s: float = 10.0) -> WorkerGroup:
    """World-size CPU ranks (local processes, gloo) for one or more live steps; close it (or use ``with``)."""
    return WorkerGroup(
        PipelineWorker,
        world_size,
        launcher="local",
        backend="gloo",
        collective_timeout_s=timeout_s,
        timeout_s=4 * timeout_s + 60.0,
        start_timeout_s=120.0,
    )


def run_spec(
    spec: dict[str, Any], group: WorkerGroup | None = None, timeout_s: float = 10.0
) -> tuple[list, list, float]:
    """Run ``train_step`` on every rank (a new group, closed after, unless ``group`` is given). Returns (records
    by rank, rank pids left alive, seconds)."""
    world = spec["pp"] * spec["dp"]
    t0 = time.monotonic()
    own = group is None
    wg = open_group(world, timeout_s) if own else group
    if wg.world_size != world:
        raise ValueError(f"the group has {wg.world_size} ranks, the layout needs PP·DP = {world}")
    try:
        results = list(wg.call("train_step", spec))
    finally:
        if own:
            wg.close()
    return results, wg.alive_pids() if own else [], time.monotonic() - t0
