"""torch.distributed inside a rank: process-group init, verl's meshes, collectives that cannot hang, teardown.

Every collective here runs with ``async_op=True`` and waits at most ``timeout_s``; a rank that waits longer raises
``CollectiveTimeout`` naming itself, the collective and the group. The rank's in-flight collective is published by
``inflight()`` so the driver's watchdog (``labkit.runtime.worker_group``) can name a hung rank even where a backend ignores
timeouts. Each guarded collective is also logged (``collective_log``: name, group, stage, micro-batch, call number,
start and end), and a rank that times out carries ``rank_report()``: where it is (stage, micro-batch, collective,
call count, Python stack), the per-rank dump verl's hang triage asks for. Meshes follow verl's layouts (the actor's
(dp, sp), the rollout's (dp, infer_tp, infer_pp))."""

from __future__ import annotations

import datetime
import math
import numbers
import os
import pickle
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from labkit.runtime import collective_log as collective_log_module
from labkit.runtime.collective_log import collective_log, log_length, where  # noqa: F401  (this module's API too)

DEFAULT_COLLECTIVE_TIMEOUT_S = 30.0
MASTER_ADDR = "127.0.0.1"


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


@dataclass
class DistState:
    """What init_dist set up in this process."""

    rank: int
    world_size: int
    backend: str
    device: str
    timeout_s: float


MAX_TIMEOUT_S = 30 * 86400
_STATE: DistState | None = None
_LISTEN: socket.socket | None = None  # rank 0's rendezvous socket, bound to MASTER_ADDR only


def _listen_on(host: str, port: int) -> socket.socket:
    """A listening socket on host:port for rank 0's TCPStore. Given to the store, it keeps the rendezvous on
    ``host`` (127.0.0.1 by default); a TCPStore that binds its own port listens on every interface."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


_INFLIGHT: dict[str, Any] | None = None
_COUNTS: Counter = Counter()  # completed collectives by name
_LOCK = threading.Lock()


# ---- set-up and teardown -----------------------------------------------------------------------------------------
def free_port(host: str = MASTER_ADDR) -> int:
    """A TCP port free right now on `host` (the driver picks MASTER_PORT with it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def choose_backend(world_size: int, backend: str = "auto") -> tuple[str, str]:
    """(backend, device kind): NCCL when every rank can own a GPU, gloo on a shared GPU, gloo on the CPU otherwise."""
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        if n_gpu >= world_size:
            return "nccl", "cuda"
        return "gloo", "cuda" if n_gpu > 0 else "cpu"
    if backend == "nccl":
        if n_gpu < world_size:
            raise ValueError(f"backend nccl needs one GPU per rank: world size {world_size}, GPUs visible {n_gpu}")
        return "nccl", "cuda"
    if backend == "gloo":
        return "gloo", "cpu"
    raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")


def init_dist(
    rank: int,
    world_size: int,
    master_port: int,
    *,
    master_addr: str = MASTER_ADDR,
    backend: str = "gloo",
    device_kind: str = "cpu",
    timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
    rendezvous_timeout_s: float = 300.0,
) -> DistState:
    """init_process_group for this rank over a TCPStore on MASTER_ADDR:port (env RANK, WORLD_SIZE, ... set too).

    The rendezvous waits up to rendezvous_timeout_s (ranks start at different times); collectives use timeout_s."""
    global _STATE
    check_timeout("timeout_s", timeout_s)
    check_timeout("rendezvous_timeout_s", rendezvous_timeout_s)
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(
            f"need 0 <= rank < world_size with world_size >= 1, got rank {rank!r}, world_size {world_size!r}"
        )
    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    device = "cpu"
    if device_kind == "cuda":
        index = rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = f"cuda:{index}"
    long = datetime.timedelta(seconds=rendezvous_timeout_s)
    global _LISTEN
    _LISTEN = _listen_on(master_addr, master_port) if rank == 0 else None
    store = dist.TCPStore(
        master_addr,
        master_port,
        world_size,
        is_master=rank == 0,
        timeout=long,
        wait_for_workers=True,
        master_listen_fd=None if _LISTEN is None else _LISTEN.fileno(),
    )
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=long)
    _STATE = DistState(rank, world_size, backend, device, timeout_s)
    set_group_timeout(None, timeout_s)
    return _STATE


def check_timeout(name: str, value: Any) -> None:
    """A timeout must be a finite number of seconds > 0: gloo reads 0 as "no timeout" (a wait falls back to the
    group's timeout, a group timeout of 0 fails every collective at once) and a negative one fails at once."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    if value > MAX_TIMEOUT_S:  # torch converts to milliseconds in C++: huge values overflow in every rank
        raise ValueError(f"{name} must be at most {MAX_TIMEOUT_S:,} seconds (30 days), got {value!r}")


def set_group_timeout(group: Any, timeout_s: float) -> None:
    """Operation timeout of an existing group (creation used the long rendezvous timeout: ranks arrive late)."""
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)  # private torch API; absent: keep the long one
    if setter is not None:
        setter(datetime.timedelta(seconds=timeout_s), group)


def state() -> DistState | None:
    """The DistState of this process, or None before init_dist / after teardown."""
    return _STATE


def teardown() -> bool:
    """destroy_process_group if one exists; True when no process group is left."""
    global _STATE, _LISTEN
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    if _LISTEN is not None:
        _LISTEN.close()
    _STATE, _LISTEN = None, None
    return not dist.is_initialized()


# ---- meshes (verl's layouts) --------------------------------------------------------------------------------------
def check_actor_mesh(world_size: int, sp: int) -> None:
    """The actor mesh (dp, sp) needs W % sp == 0 (verl builds it as (W // sp, sp))."""
    if sp < 1 or world_size % sp != 0:
        raise ValueError(
            f"world size {world_size} is not divisible by ulysses_sequence_parallel_size {sp}: "
            f"the actor mesh (dp, sp) needs world_size % sp == 0"
        )


def check_rollout_mesh(world_size: int, tp: int, rdp: int = 1, pp: int = 1) -> None:
    """E23, verl's text. Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker._build_rollout."""
    infer_world_size = tp * rdp * pp
    if world_size % infer_world_size != 0:
        raise AssertionError(
            f"rollout world_size: {world_size} is not divisible by infer_world_size: {infer_world_size}"
        )


def device_type() -> str:
    """Device type for meshes of this rank: "cuda" under NCCL, else "cpu" (gloo, also when ranks share a GPU)."""
    return "cuda" if _STATE is not None and _STATE.backend == "nccl" else "cpu"


def actor_mesh(sp: int = 1):
    """Ulysses mesh (dp=W//sp, sp) named ("dp", "sp"): rank r has dp_rank r // sp, sp_rank r % sp."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    check_actor_mesh(world, sp)
    return _short_timeouts(init_device_mesh(device_type(), (world // sp, sp), mesh_dim_names=("dp", "sp")))


def rollout_mesh(tp: int = 1, rdp: int = 1, pp: int = 1):
    """Rollout mesh (dp, infer_tp=tp*rdp, infer_pp=pp) as verl's _build_rollout; E23 when W is not divisible."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    check_rollout_mesh(world, tp, rdp, pp)
    infer_tp = tp * rdp
    return _short_timeouts(
        init_device_mesh(
            device_type(), (world // (infer_tp * pp), infer_tp, pp), mesh_dim_names=("dp", "infer_tp", "infer_pp")
        )
    )


def _short_timeouts(mesh: Any) -> Any:
    """Give every group of a new mesh the collective timeout (subgroups are created with torch's long default)."""
    for name in mesh.mesh_dim_names:
        set_group_timeout(mesh.get_group(name), _STATE.timeout_s if _STATE else DEFAULT_COLLECTIVE_TIMEOUT_S)
    return mesh


def dp_rank(mesh) -> int:
    """This rank's index along the mesh's "dp" dimension (actor and rollout meshes alike)."""
    return mesh.get_local_rank("dp")


def sp_rank(mesh) -> int:
    """This rank's index in its Ulysses SP group (actor mesh)."""
    return mesh.get_local_rank("sp")


def tp_rank(mesh) -> int:
    """This rank's index in its rollout TP group (rollout mesh dimension "infer_tp")."""
    return mesh.get_local_rank("infer_tp")


def group_rank(group: Any = None) -> int:
    """This rank's index inside `group` (None: the world)."""
    return dist.get_rank(group)


def group_size(group: Any = None) -> int:
    """Number of ranks in `group` (None: the world)."""
    return dist.get_world_size(group)


def group_ranks(group: Any = None) -> list[int]:
    """Global ranks of a process group (None: the world)."""
    if group is None:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(group)


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
    collective_log_module.note(name, outcome, t_start, _STATE.rank if _STATE else None, **extra)


def rank_report() -> dict[str, Any]:
    """Where this rank is now: stage, micro-batch, the collective it waits in (or last completed), that
    collective's call count, every collective's completed count and the main thread's Python stack."""
    current = inflight()
    done = collective_log_module.last()
    shown = current or done or {}
    here = collective_log_module.labels()  # where the rank is now (also inside a collective torch runs itself)
    at = current or (here if here["stage"] is not None else shown)
    return {
        "rank": _STATE.rank if _STATE else None,
        "pid": os.getpid(),
        "stage": at.get("stage"),
        "micro_batch": at.get("micro_batch"),
        "waiting_in": current["collective"] if current else None,
        "last_completed": done["collective"] if done else None,
        "call": shown.get("call"),
        "waited_s": current["elapsed_s"] if current else None,
        "group": shown.get("group"),
        "counts": collective_counts(),
        "stack": collective_log_module.main_stack((__file__,)),
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
    timeout = timeout_s if timeout_s is not None else (_STATE.timeout_s if _STATE else DEFAULT_COLLECTIVE_TIMEOUT_S)
    ranks = group_ranks(group)
    t0 = time.monotonic()
    event = collective_log_module.begin(name, ranks, _STATE.rank if _STATE else None)
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
    with guarded("barrier", group, timeout_s) as timeout:
        _wait(
            dist.all_reduce(torch.zeros(1, device=_STATE.device if _STATE else "cpu"), group=group, async_op=True),
            timeout,
        )


def all_gather_object(
    obj: Any, group: Any = None, timeout_s: float | None = None, _count: bool = True, name: str = "all_gather_object"
) -> list[Any]:
    """Pickle → padded uint8 all_gather (two guarded collectives) → unpickle; one object per group rank. Counted
    once under ``name`` (a planner name such as "all_gather_object(metrics)")."""
    device = _STATE.device if _STATE else "cpu"
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

    tensors = {}
    if data.batch is not None:
        for key in sorted(data.batch.keys()):
            value = data.batch[key]
            moved = value.to(_STATE.device) if _STATE and _STATE.device != "cpu" else value
            parts = all_gather(moved, group, timeout_s, "all_gather(data_proto)", False)
            tensors[key] = torch.cat([p.to(value.device) for p in parts], dim=0)
    parts = all_gather_object(data.non_tensor_batch, group, timeout_s, _count=False)
    non_tensors = {k: np.concatenate([p[k] for p in parts], axis=0) for k in data.non_tensor_batch}
    _COUNTS["all_gather(data_proto)"] += 1
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=data.meta_info)
