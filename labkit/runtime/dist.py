"""Collectives inside a rank that cannot hang: each torch.distributed call runs with ``async_op=True`` and waits at
most ``timeout_s``; a rank that waits longer raises ``CollectiveTimeout`` naming itself, the collective and the group.

The rank's in-flight collective is published by ``inflight()`` so the driver's watchdog
(``labkit.runtime.call_watchdog``) can name a hung rank even where a backend ignores timeouts. Each guarded collective
is also logged (``collective_log``: name, group, stage, micro-batch, call number, start and end), and a rank that times
out carries ``rank_report()``: where it is (stage, micro-batch, collective, call count, Python stack), the per-rank dump
verl's hang triage asks for. The process group these run on is set up in ``labkit.runtime.process_group``, verl's
meshes in ``labkit.runtime.meshes``."""

from __future__ import annotations

import datetime
import os
import pickle
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from labkit.runtime import collective_log as collective_log_module
from labkit.runtime import meshes, process_group
from labkit.runtime.collective_log import collective_log, log_length, where  # noqa: F401  (this module's API too)
from labkit.runtime.meshes import group_ranks
from labkit.runtime.process_group import DEFAULT_COLLECTIVE_TIMEOUT_S, check_timeout, state


class CollectiveTimeout(RuntimeError):
    """A rank waited too long in a collective (or its peers left it): names the rank, the collective and the group."""

    def __init__(
        self,
        rank: int,
        name: str,
        group_ranks: list[int] | None,
        elapsed_s: float,
        timeout_s: float,
        detail: str = "",
        report: dict[str, Any] | None = None,
    ) -> None:
        self.rank, self.collective, self.group_ranks = rank, name, group_ranks
        self.elapsed_s, self.timeout_s = elapsed_s, timeout_s
        self.report = report  # rank_report() taken when the wait ended (stage, micro-batch, call count, stack)
        msg = (
            f"rank {rank}: collective {name} over ranks {group_ranks} did not complete after {elapsed_s:.1f} s "
            f"(timeout {timeout_s:g} s): a peer never entered it, raised, or died"
        )
        super().__init__(msg + (f" [{detail}]" if detail else ""))


_INFLIGHT: dict[str, Any] | None = None
_COUNTS: Counter = Counter()  # completed collectives by name
_LOCK = threading.Lock()
_WRAPPER_FILES = (__file__, meshes.__file__, process_group.__file__)  # labkit's torch.distributed wrappers: not shown


# ---- guarded collectives ------------------------------------------------------------------------------------------
def inflight() -> dict[str, Any] | None:
    """The collective this rank is waiting in: {"collective", "group", "elapsed_s", "timeout_s"}, or None."""
    with _LOCK:
        if _INFLIGHT is None:
            return None
        out = dict(_INFLIGHT)
    out["elapsed_s"] = time.monotonic() - out.pop("t0")
    return out


def collective_counts() -> dict[str, int]:
    """How many collectives of each kind this rank has completed through labkit.runtime.dist (for the trace)."""
    return dict(_COUNTS)


def note(name: str, outcome: str, t_start: float, **extra: Any) -> None:
    """Log a non-collective event in this rank's timeline (a rank that raised, a loop that never advanced)."""
    dist_state = state()
    collective_log_module.note(name, outcome, t_start, dist_state.rank if dist_state else None, **extra)


def rank_report() -> dict[str, Any]:
    """Where this rank is now: stage, micro-batch, the collective it waits in (or last completed), that
    collective's call count, every collective's completed count and the main thread's Python stack."""
    dist_state, current = state(), inflight()
    done = collective_log_module.last()
    shown = current or done or {}
    here = collective_log_module.labels()  # where the rank is now (also inside a collective torch runs itself)
    at = current or (here if here["stage"] is not None else shown)
    return {
        "rank": dist_state.rank if dist_state else None,
        "pid": os.getpid(),
        "stage": at.get("stage"),
        "micro_batch": at.get("micro_batch"),
        "waiting_in": current["collective"] if current else None,
        "last_completed": done["collective"] if done else None,
        "call": shown.get("call"),
        "waited_s": current["elapsed_s"] if current else None,
        "group": shown.get("group"),
        "counts": collective_counts(),
        "stack": collective_log_module.main_stack(_WRAPPER_FILES),
    }


def report_for(exc: BaseException) -> dict[str, Any]:
    """The rank_report of an exception raised inside a collective torch ran itself (FSDP's all-gathers): stage and
    micro-batch from the where() block it left, the torch function it waited in, and the stack it came through."""
    report = rank_report()
    labels = getattr(exc, "lk_where", None) or {}
    report.update(stage=labels.get("stage"), micro_batch=labels.get("micro_batch"))
    tb, fn = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace(os.sep, "/").endswith("distributed/distributed_c10d.py"):
            fn = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    if fn is not None:
        report.update(waiting_in=f"torch.distributed.{fn}", call=None)
    report["stack"] = collective_log_module.exception_stack(exc)
    return report


@contextmanager
def guarded(name: str, group: Any = None, timeout_s: float | None = None, count: bool = True) -> Iterator[float]:
    """Publish "this rank waits in collective `name`" while the block runs; a RuntimeError inside (gloo's timeout or
    peer loss) becomes CollectiveTimeout naming rank, collective and group, with rank_report(). Yields the timeout
    to wait with. Every call is logged (collective_log) under the current where() labels."""
    global _INFLIGHT
    if timeout_s is not None:
        check_timeout("timeout_s", timeout_s)
    dist_state = state()
    timeout = (
        timeout_s if timeout_s is not None else (dist_state.timeout_s if dist_state else DEFAULT_COLLECTIVE_TIMEOUT_S)
    )
    ranks = group_ranks(group)
    t0 = time.monotonic()
    event = collective_log_module.begin(name, ranks, dist_state.rank if dist_state else None)
    with _LOCK:
        _INFLIGHT = {k: event[k] for k in ("collective", "group", "stage", "micro_batch", "call")}
        _INFLIGHT.update(t0=t0, timeout_s=timeout)
    try:
        yield timeout
    except CollectiveTimeout:
        raise
    except RuntimeError as exc:  # gloo: "Operation timed out!", "Connection closed by peer", ...
        report = rank_report()
        collective_log_module.end(event, "timeout")
        raise CollectiveTimeout(
            dist.get_rank(), name, ranks, time.monotonic() - t0, timeout, str(exc)[:300], report
        ) from exc
    else:
        collective_log_module.end(event, "ok")
        if count:
            _COUNTS[name] += 1
    finally:
        with _LOCK:
            _INFLIGHT = None if _INFLIGHT is None or _INFLIGHT["t0"] == t0 else _INFLIGHT
        if event["t_end"] is None:  # left by another exception (KeyboardInterrupt, ...)
            collective_log_module.end(event, "interrupted")


@contextmanager
def waiting_on(name: str, group: Any = None) -> Iterator[None]:
    """Publish "this rank waits on the peers of ``group`` in ``name``, with no timeout" while the block runs: code that
    synchronises outside labkit's collectives (a vLLM engine's TP all-reduces). The driver's watchdog then knows such
    a rank can never finish once a peer has raised, and reports the peer's error at once. Exceptions pass unchanged."""
    global _INFLIGHT
    t0 = time.monotonic()
    with _LOCK:
        _INFLIGHT = {"collective": name, "group": group_ranks(group), "stage": None, "micro_batch": None,
                     "call": None, "t0": t0, "timeout_s": None, "unbounded": True}  # fmt: skip
    try:
        yield
    finally:
        with _LOCK:
            _INFLIGHT = None if _INFLIGHT is None or _INFLIGHT["t0"] == t0 else _INFLIGHT


def _wait(work: Any, timeout: float) -> None:
    work.wait(datetime.timedelta(seconds=timeout))


def all_reduce(
    tensor: torch.Tensor, op: str = "sum", group: Any = None, timeout_s: float | None = None, name: str = "all_reduce"
) -> torch.Tensor:
    """In-place all_reduce (sum/max/min/avg via sum) with a timeout; ``name`` is what the counts and the log call it
    (a planner name such as "all_reduce(max):num_micro_batches")."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.SUM}
    with guarded(name, group, timeout_s) as timeout:
        _wait(dist.all_reduce(tensor, op=ops[op], group=group, async_op=True), timeout)
    if op == "avg":
        tensor /= dist.get_world_size(group)
    return tensor


def all_gather(
    tensor: torch.Tensor,
    group: Any = None,
    timeout_s: float | None = None,
    _name: str = "all_gather",
    _count: bool = True,
) -> list[torch.Tensor]:
    """all_gather of equally shaped tensors with a timeout; returns one tensor per group rank."""
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    with guarded(_name, group, timeout_s, _count) as timeout:
        _wait(dist.all_gather(out, tensor.contiguous(), group=group, async_op=True), timeout)
    return out


def reduce_scatter(
    tensor: torch.Tensor, group: Any = None, timeout_s: float | None = None, name: str = "reduce_scatter"
) -> torch.Tensor:
    """Sum-reduce ``tensor`` (first dim divisible by the group size) and keep this rank's slice, with a timeout
    (the list form: gloo has it on every torch this project supports)."""
    n = dist.get_world_size(group)
    if tensor.shape[0] % n:
        raise ValueError(f"reduce_scatter needs a first dimension divisible by {n}, got {tuple(tensor.shape)}")
    parts = [p.contiguous() for p in tensor.chunk(n)]
    out = torch.empty_like(parts[0])
    with guarded(name, group, timeout_s) as timeout:
        _wait(dist.reduce_scatter(out, parts, group=group, async_op=True), timeout)
    return out


def barrier(group: Any = None, timeout_s: float | None = None) -> None:
    """A barrier with a timeout (an all_reduce of one element, so gloo and NCCL behave alike)."""
    dist_state = state()
    with guarded("barrier", group, timeout_s) as timeout:
        _wait(
            dist.all_reduce(
                torch.zeros(1, device=dist_state.device if dist_state else "cpu"), group=group, async_op=True
            ),
            timeout,
        )


def all_gather_object(
    obj: Any, group: Any = None, timeout_s: float | None = None, _count: bool = True, name: str = "all_gather_object"
) -> list[Any]:
    """Pickle → padded uint8 all_gather (two guarded collectives) → unpickle; one object per group rank. Counted
    once under ``name`` (a planner name such as "all_gather_object(metrics)")."""
    dist_state = state()
    device = dist_state.device if dist_state else "cpu"
    payload = torch.from_numpy(np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()).to(device)
    sizes = all_gather(torch.tensor([payload.numel()], device=device), group, timeout_s, name, False)
    width = int(max(s.item() for s in sizes))
    padded = torch.zeros(width, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    parts = all_gather(padded, group, timeout_s, name, False)
    if _count:
        _COUNTS[name] += 1
    return [pickle.loads(p[: int(s.item())].cpu().numpy().tobytes()) for p, s in zip(parts, sizes)]


def all_gather_data_proto(data: Any, group: Any = None, timeout_s: float | None = None) -> Any:
    """Rows of every group rank concatenated in group-rank order (tensors and non-tensors); counted as one
    "all_gather(data_proto)", the planner's name. Mirrors verl/protocol.py: all_gather_data_proto (the ≤v0.5 TP/SP
    pre-processing); returns a new DataProto."""
    from labkit.protocol.data_proto import DataProto

    dist_state, tensors = state(), {}
    if data.batch is not None:
        for key in sorted(data.batch.keys()):
            value = data.batch[key]
            moved = value.to(dist_state.device) if dist_state and dist_state.device != "cpu" else value
            parts = all_gather(moved, group, timeout_s, "all_gather(data_proto)", False)
            tensors[key] = torch.cat([p.to(value.device) for p in parts], dim=0)
    parts = all_gather_object(data.non_tensor_batch, group, timeout_s, _count=False)
    non_tensors = {k: np.concatenate([p[k] for p in parts], axis=0) for k in data.non_tensor_batch}
    _COUNTS["all_gather(data_proto)"] += 1
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=data.meta_info)
