"""The update's pipeline schedule per stage, as megatron-core 0.16.1 runs it, and its time-step timeline.

megatron-core picks one of three schedules (``megatron/core/pipeline_parallel/schedules.py:
get_forward_backward_func``):

- PP = 1, ``forward_backward_no_pipelining``: forward then backward of each micro-batch; one in flight.
- PP > 1 without VPP, ``forward_backward_pipelining_without_interleaving`` (1F1B): stage r runs
  warmup = min(PP − r − 1, Mμ) forwards, then Mμ − warmup steady (one forward, one backward) steps, then the warmup's
  backwards (cooldown). It holds min(PP − r, Mμ) micro-batches' activations at its peak.
- PP > 1 with VPP = V, ``forward_backward_pipelining_with_interleaving``: each stage holds V model chunks (virtual
  stage c·PP + r); the order of (micro-batch, chunk) forwards is ``get_schedule_table`` (groups of G micro-batches
  per chunk, G = ``microbatch_group_size_per_vp_stage``, default PP), backwards walk the same table with the chunks
  reversed; warmup = 2(PP − r − 1) + (V − 1)·G chunk-forwards, capped at Mμ·V (``get_pp_rank_microbatches``).

Every step k of the steady phase is forward k + warmup then backward k; ``forward_only`` (log-prob, ref, values)
runs every forward and no backward. The timeline executes each stage's actions in that order, each as soon as the
stage is free and its input has arrived (the previous virtual stage's forward, the next one's backward; P2P is
free), a chunk forward taking ``t_forward / V`` and a backward ``t_backward / V``. The bubble is the idle share of
the makespan; with equal stages it matches (PP − 1)/(V·Mμ + PP − 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEDULES = "megatron/core/pipeline_parallel/schedules.py"


@dataclass(frozen=True)
class ScheduleCheck:
    """A megatron-core schedule check that fails: the exception, its exact text and the numbers behind it."""

    error: str
    message: str
    arithmetic: str
    source: str = f"{SCHEDULES}: forward_backward_pipelining_with_interleaving"


@dataclass(frozen=True)
class P2P:
    """A stage's point-to-point transfers per micro-batch (summed over its chunks) and its two peers (PP stages)."""

    recv_forward: int
    send_forward: int
    recv_backward: int
    send_backward: int
    prev_stage: int
    next_stage: int


@dataclass(frozen=True)
class StageSchedule:
    """One pipeline stage's work in one ``forward_backward`` call."""

    stage: int
    actions: list[tuple[str, int, int]]
    """In order: (``F`` or ``B``, micro-batch, model chunk)."""
    warmup: int
    """Chunk-forwards before the first backward (``num_warmup_microbatches``)."""
    steady: int
    """One-forward-one-backward steps (``num_microbatches_remaining``)."""
    cooldown: int
    """Chunk-backwards after the last forward."""
    peak_in_flight: int
    """The most chunk-forwards whose activations wait for their backward (0 under forward_only)."""
    p2p: P2P
    starts: list[float]
    """Start of each action in time units (one micro-batch's forward through the whole stage = ``t_forward``)."""
    ends: list[float]

    @property
    def timeline(self) -> list[tuple[float, float, str, int, int]]:
        """(start, end, kind, micro-batch, chunk) per action."""
        return [(s, e, *a) for s, e, a in zip(self.starts, self.ends, self.actions)]


@dataclass(frozen=True)
class PipelineSchedule:
    """The schedule of every stage, which megatron-core function runs it, and the bubble of its timeline."""

    function: str
    pp: int
    vpp: int | None
    num_microbatches: int
    group_size: int | None
    """G = ``microbatch_group_size_per_vp_stage`` (interleaved only)."""
    forward_only: bool
    stages: list[StageSchedule]
    makespan: float
    bubble_fraction: float
    """Idle share of all stages' time up to the makespan, from the timeline."""

    @property
    def chunks(self) -> int:
        return self.vpp if self.function.endswith("with_interleaving") else 1

    @property
    def closed_form_bubble(self) -> float:
        """(PP − 1)/(V·Mμ + PP − 1), the textbook bubble of (interleaved) 1F1B with equal stages."""
        v, m = self.chunks, self.num_microbatches
        return (self.pp - 1) / (v * m + self.pp - 1)

    @property
    def peak_stage_equivalents(self) -> list[float]:
        """Per stage, peak in-flight chunk-forwards / V: activations held in units of one micro-batch over all of
        a stage's layers (L/PP)."""
        return [s.peak_in_flight / self.chunks for s in self.stages]


def function_name(pp: int, vpp: int | None) -> str:
    """The megatron-core schedule ``get_forward_backward_func`` picks."""
    if pp == 1:
        return "forward_backward_no_pipelining"
    if vpp is None:
        return "forward_backward_pipelining_without_interleaving"
    return "forward_backward_pipelining_with_interleaving"


def _positive(**sizes: int | None) -> None:
    for name, v in sizes.items():
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def schedule_check(
    pp: int, vpp: int | None, num_microbatches: int, group_size: int | None = None
) -> ScheduleCheck | None:
    """The interleaved schedule's checks (``forward_backward_pipelining_with_interleaving``), or None: G must lie in
    [PP, Mμ], and Mμ % G must be 0 or at least PP. G defaults to PP (``ModelParallelConfig.__post_init__``)."""
    _positive(pp=pp, vpp=vpp, num_microbatches=num_microbatches)
    if function_name(pp, vpp) != "forward_backward_pipelining_with_interleaving":
        return None
    m, g = num_microbatches, pp if group_size is None else group_size
    if g > m or g < pp:
        msg = f"The number of contiguous micro-batches in a virtual pipeline stageshould range in [PP={pp} , M={m}]"
        return ScheduleCheck("ValueError", msg, f"G = {g} is outside [PP = {pp}, Mμ = {m}]")
    rem = m % g
    if 0 < rem < pp:
        msg = (
            "The remainder of M (the total micro-batches) divided by N (number of contiguous micro-batches in a "
            "virtual pipeline stage) should be 0, or larger than or equal to the pipeline-parallel size, but it is "
            f"{rem}. Otherwise, it introduces dependency bubbles in the pipeline and reduces throughput."
        )
        return ScheduleCheck("RuntimeError", msg, f"Mμ % G = {m} % {g} = {rem}, 0 < {rem} < PP = {pp}")
    return None


def schedule_table(num_microbatches: int, chunks: int, group_size: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each chunk-forward in order (``schedules.py: get_schedule_table``): G micro-batches
    through chunk 0, the same G through chunk 1, ...; the last group takes every remaining micro-batch."""
    table: list[tuple[int, int]] = []
    for lo in range(0, num_microbatches, group_size):
        hi = num_microbatches if lo + group_size >= num_microbatches else lo + group_size
        table.extend((mb, c) for c in range(chunks) for mb in range(lo, hi))
    return table


def warmup_count(
    pp: int,
    stage: int,
    vpp: int | None,
    num_microbatches: int,
    group_size: int | None = None,
    forward_only: bool = False,
) -> int:
    """``num_warmup_microbatches`` of ``stage``: 0 without pipelining; min(PP − r − 1, Mμ) under 1F1B (forward_only
    too); interleaved (``get_pp_rank_microbatches``) 2(PP − r − 1) + (V − 1)·G capped at Mμ·V, all Mμ·V if
    forward_only."""
    fn = function_name(pp, vpp)
    if fn == "forward_backward_no_pipelining":
        return 0
    if fn == "forward_backward_pipelining_without_interleaving":
        return min(pp - stage - 1, num_microbatches)
    if forward_only:
        return num_microbatches * vpp
    g = pp if group_size is None else group_size
    return min(2 * (pp - stage - 1) + (vpp - 1) * g, num_microbatches * vpp)


def _order(total: int, warmup: int, forward_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """(is_forward, table index) of each action: forwards 0..warmup-1, then forward k + warmup and backward k per
    steady step, then the remaining backwards."""
    if forward_only:
        return np.ones(total, dtype=bool), np.arange(total)
    steady = total - warmup
    is_f = np.concatenate([np.ones(warmup, bool), np.tile([True, False], steady), np.zeros(warmup, bool)])
    mid = np.stack([np.arange(warmup, total), np.arange(steady)], axis=1).reshape(-1)
    return is_f, np.concatenate([np.arange(warmup), mid, np.arange(steady, total)])


def _stage_arrays(
    table: np.ndarray, chunks: int, warmup: int, forward_only: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    is_f, k = _order(len(table), warmup, forward_only)
    mb, c = table[k].T
    return is_f, mb, np.where(is_f, c, chunks - 1 - c)


def stage_actions(
    table: list[tuple[int, int]], chunks: int, warmup: int, forward_only: bool = False
) -> list[tuple[str, int, int]]:
    """A stage's actions: forwards 0..warmup-1, then forward k + warmup and backward k per steady step, then the
    remaining backwards. Backward k runs table entry k with the chunks reversed (the pipeline drains backwards)."""
    is_f, mb, c = _stage_arrays(np.asarray(table, dtype=np.int64).reshape(-1, 2), chunks, warmup, forward_only)
    return list(zip(np.where(is_f, "F", "B").tolist(), mb.tolist(), c.tolist()))


def _simulate(
    stages: list[tuple[np.ndarray, np.ndarray, np.ndarray]], pp: int, chunks: int, m: int, tf: float, tb: float
) -> list[np.ndarray]:
    """Per stage, the end time of each action in chunk time units: each action starts when its stage is free and
    its input is there (forward: virtual stage v − 1's forward; backward: v + 1's backward, or its own forward on
    the last virtual stage). An event-driven pass: a blocked stage sleeps until the action it waits for ends."""
    n, last = pp * chunks * m, pp * chunks - 1
    jobs = []
    for r, (is_f, mb, c) in enumerate(stages):
        v = c * pp + r
        i = v * m + mb
        me = np.where(is_f, i, n + i)
        dep = np.where(is_f, np.where(v > 0, i - m, -1), np.where(v < last, n + i + m, i))
        jobs.append((me.tolist(), dep.tolist(), np.where(is_f, tf, tb).tolist(), [0.0] * len(is_f)))
    fin = [-1.0] * (2 * n)
    waiter = [-1] * (2 * n)
    pos, free = [0] * pp, [0.0] * pp
    work = list(range(pp))
    while work:
        r = work.pop()
        me, dep, cost, ends = jobs[r]
        i, t, size = pos[r], free[r], len(me)
        while i < size:
            d = dep[i]
            if d >= 0:
                e = fin[d]
                if e < 0:
                    waiter[d] = r
                    break
                if e > t:
                    t = e
            t += cost[i]
            ends[i] = t
            k = me[i]
            fin[k] = t
            if waiter[k] >= 0:
                work.append(waiter[k])
            i += 1
        pos[r], free[r] = i, t
    if any(p != len(js[0]) for p, js in zip(pos, jobs)):
        raise AssertionError("pipeline schedule deadlocked")  # megatron-core's orders never do
    return [np.asarray(js[3]) for js in jobs]


def pipeline_schedule(
    pp: int,
    vpp: int | None,
    num_microbatches: int,
    group_size: int | None = None,
    *,
    forward_only: bool = False,
    t_forward: float = 1,
    t_backward: float = 2,
) -> PipelineSchedule:
    """Every stage's schedule of one ``forward_backward`` call over ``num_microbatches`` micro-batches, as
    megatron-core 0.16.1 orders it, with its timeline. ValueError (megatron-core's text) if ``schedule_check``
    fails; ``t_forward``/``t_backward``: one micro-batch through a whole stage (all its chunks)."""
    if bad := schedule_check(pp, vpp, num_microbatches, group_size):
        raise ValueError(f"{bad.error}: {bad.message}")
    _positive(group_size=group_size)
    if not (t_forward > 0 and t_backward > 0):
        raise ValueError(f"t_forward and t_backward must be positive, got {t_forward!r}, {t_backward!r}")
    fn, m = function_name(pp, vpp), num_microbatches
    interleaved = fn.endswith("with_interleaving")
    chunks = vpp if interleaved else 1
    g = (pp if group_size is None else group_size) if interleaved else None
    table = schedule_table(m, chunks, g) if interleaved else [(mb, 0) for mb in range(m)]
    total = len(table)
    warm = [warmup_count(pp, r, vpp, m, g, forward_only) for r in range(pp)]
    arr = np.asarray(table, dtype=np.int64).reshape(-1, 2)
    per_stage = [_stage_arrays(arr, chunks, warm[r], forward_only) for r in range(pp)]
    ends_all = _simulate(per_stage, pp, chunks, m, t_forward, t_backward)
    stages, busy = [], 0.0
    makespan = float(max(e[-1] for e in ends_all))
    for r, ((is_f, mb, c), ends) in enumerate(zip(per_stage, ends_all)):
        starts = ends - np.where(is_f, t_forward, t_backward)
        busy += float((ends - starts).sum())
        peak = 0 if forward_only else int(np.cumsum(np.where(is_f, 1, -1)).max(initial=0))
        vs = [ch * pp + r for ch in range(chunks)]
        n_first, n_last = sum(v > 0 for v in vs), sum(v < pp * chunks - 1 for v in vs)
        bw = 0 if forward_only else 1
        p2p = P2P(n_first, n_last, n_last * bw, n_first * bw, (r - 1) % pp, (r + 1) % pp)
        steady, cooldown = total - warm[r], 0 if forward_only else warm[r]
        acts = list(zip(np.where(is_f, "F", "B").tolist(), mb.tolist(), c.tolist()))
        starts, ends = (starts / chunks).tolist(), (ends / chunks).tolist()
        stages.append(StageSchedule(r, acts, warm[r], steady, cooldown, peak, p2p, starts, ends))
    bubble = 1 - busy / (pp * makespan)
    return PipelineSchedule(fn, pp, vpp, m, g, forward_only, stages, makespan / chunks, bubble)
