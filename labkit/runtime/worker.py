"""What a worker class declares for verl's single controller: the Worker base class (rank, world, per-mesh dispatch
info, named groups) and ``register`` with its dispatch and execute modes.

The driver side of these declarations (how each mode splits arguments and collects outputs) is in
``labkit.runtime.dispatch``. Mirrors verl/single_controller/base/decorator.py (register, Dispatch, Execute) and
base/worker.py (semantics, not code)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

REGISTER_ATTR = "_labkit_register"


class Dispatch(Enum):
    """Predefined dispatch modes. Mirrors verl's Dispatch (RANK_ZERO and DIRECT_ROLLOUT_METHOD omitted)."""

    ONE_TO_ALL = "ONE_TO_ALL"
    ALL_TO_ALL = "ALL_TO_ALL"
    DP_COMPUTE = "DP_COMPUTE"
    DP_COMPUTE_PROTO = "DP_COMPUTE_PROTO"
    DP_COMPUTE_PROTO_WITH_FUNC = "DP_COMPUTE_PROTO_WITH_FUNC"
    DP_COMPUTE_METRIC = "DP_COMPUTE_METRIC"


class Execute(Enum):
    """Which ranks run a call. Mirrors verl's Execute."""

    ALL = "ALL"
    RANK_ZERO = "RANK_ZERO"


@dataclass(frozen=True)
class MethodSpec:
    """What `register` attached to a worker method."""

    dispatch_mode: Any
    execute_mode: Execute = Execute.ALL
    blocking: bool = True
    materialize_futures: bool = True
    all_gather_group: str | None = None

    @property
    def mode_name(self) -> str:
        if isinstance(self.dispatch_mode, Dispatch):
            return self.dispatch_mode.value
        return f"nd_compute_dataproto({self.dispatch_mode.get('mesh_name')})"


def register(
    dispatch_mode: Any = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
    all_gather_group: str | None = None,
) -> Callable:
    """Mark a worker method for group dispatch. Mirrors verl's decorator.register.

    all_gather_group (labkit, the ≤v0.5 TP/SP variant of DP_COMPUTE_PROTO): inside each rank, DataProto arguments are
    all-gathered over the worker's group of that name before the method runs, and the output is sliced back."""
    if not isinstance(dispatch_mode, (Dispatch, dict)):
        raise AssertionError(f"dispatch_mode must be a Dispatch or a Dict. Got {dispatch_mode}")
    if isinstance(dispatch_mode, dict):
        for key in ("dispatch_fn", "collect_fn"):
            if key not in dispatch_mode:
                raise AssertionError(f"key {key} should be in dispatch_mode if it is a dictionary")
    if not isinstance(execute_mode, Execute):
        raise AssertionError(f"execute_mode must be a Execute. Got {execute_mode}")
    if all_gather_group is not None and dispatch_mode is not Dispatch.DP_COMPUTE_PROTO:
        raise ValueError(
            f"all_gather_group={all_gather_group!r} is the ≤v0.5 variant of DP_COMPUTE_PROTO only, "
            f"not of {dispatch_mode}"
        )
    spec = MethodSpec(dispatch_mode, execute_mode, blocking, materialize_futures, all_gather_group)

    def decorator(func: Callable) -> Callable:
        setattr(func, REGISTER_ATTR, spec)
        return func

    return decorator


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every method of `cls` (and its bases) that carries a `register` spec."""
    out = {}
    for name in dir(cls):
        spec = getattr(getattr(cls, name, None), REGISTER_ATTR, None)
        if isinstance(spec, MethodSpec):
            out[name] = spec
    return out


class Worker:
    """Base class of a rank's worker: rank/world from the environment, per-mesh dispatch info, named groups.

    Mirrors verl/single_controller/base/worker.py: Worker (_register_dispatch_collect_info and the queries)."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self._lk_dispatch: dict[str, dict[str, Any]] = {}
        self._lk_groups: dict[str, tuple[Any, str, str | None]] = {}

    @classmethod
    def check_world(cls, world_size: int, **init_kwargs: Any) -> None:
        """Driver-side check of (world size, init kwargs) before any process starts; override to raise early."""

    def _register_dispatch_collect_info(
        self, mesh_name: str, dp_rank: int, is_collect: bool, **coords: int | None
    ) -> None:
        """Record this rank's dp_rank and is_collect for a mesh (coords: tp_rank/sp_rank for the trace)."""
        if mesh_name in self._lk_dispatch:
            raise ValueError(f"mesh_name {mesh_name} has been registered")
        self._lk_dispatch[mesh_name] = {"dp_rank": int(dp_rank), "is_collect": bool(is_collect), **coords}

    def register_group(self, name: str, group: Any, coord: str, mesh_name: str | None = None) -> None:
        """Name a process group for `register(..., all_gather_group=name)`.

        coord ("tp_rank" or "sp_rank") is this rank's index in the group; mesh_name gives dp_rank for the trace."""
        self._lk_groups[name] = (group, coord, mesh_name)

    def _lk_query(self, mesh_name: str, key: str) -> Any:
        if mesh_name not in self._lk_dispatch:
            raise AssertionError(f"{mesh_name} is not registered in {type(self).__name__}")
        return self._lk_dispatch[mesh_name][key]

    def rank_coords(self, mesh_name: str | None = None) -> dict[str, int | None]:
        """dp_rank / tp_rank / sp_rank of this rank for a registered mesh (None entries where not defined)."""
        info = self._lk_dispatch.get(mesh_name, {}) if mesh_name else {}
        return {k: info.get(k) for k in ("dp_rank", "tp_rank", "sp_rank")}
