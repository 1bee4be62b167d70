"""This rank's default torch.distributed process group: its rendezvous (a TCPStore on 127.0.0.1), the backend choice,
the timeouts every group is held to, and teardown.

The guarded collectives are in ``labkit.runtime.dist``, verl's meshes in ``labkit.runtime.meshes``; both read the
state kept here (``state()``)."""

from __future__ import annotations

import datetime
import math
import numbers
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

DEFAULT_COLLECTIVE_TIMEOUT_S = 30.0
MASTER_ADDR = "127.0.0.1"


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
