"""verl's single-controller vocabulary: the Worker base class, `register`, dispatch modes and collect rules.

Pure functions of the driver's arguments and the ranks' registered dispatch info; no processes are started here.
Mirrors verl/single_controller/base/decorator.py and base/worker.py (semantics, not code)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from labkit.protocol.data_proto import DataProto


def is_data_proto(obj: Any) -> bool:
    """isinstance(obj, DataProto) without importing labkit.protocol.data_proto (tensordict pulls torch._dynamo, ~2 CPU-s per
    rank): an object can only be a DataProto once its module is loaded, e.g. by unpickling one."""
    mod = sys.modules.get("labkit.protocol.data_proto")
    return mod is not None and isinstance(obj, mod.DataProto)


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


# ---- what a rank holds: rows and tokens ---------------------------------------------------------------------------
def rows_tokens(obj: Any) -> tuple[int, int | None]:
    """Rows of a DataProto/array/tensor (0 for other objects) and tokens = sum of attention_mask when present."""
    if is_data_proto(obj):
        tokens = None
        if obj.batch is not None and "attention_mask" in obj.batch.keys():
            tokens = int(obj.batch["attention_mask"].sum().item())
        return len(obj), tokens
    if isinstance(obj, (np.ndarray, torch.Tensor)) and obj.ndim > 0:
        return int(obj.shape[0]), None
    return 0, None


def first_batch_arg(args: tuple, kwargs: dict) -> Any:
    """The first DataProto among args then kwargs (what the trace counts), else the first argument, else None."""
    values = list(args) + list(kwargs.values())
    for v in values:
        if is_data_proto(v):
            return v
    return values[0] if values else None


# ---- dispatch functions: (wg, *args, **kwargs) -> (args as per-rank lists, kwargs as per-rank lists, pad) -----------
Split = tuple[tuple[list, ...], dict[str, list], int]


def dispatch_one_to_all(wg: Any, *args: Any, **kwargs: Any) -> Split:
    """Every rank gets the same arguments."""
    n = wg.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}, 0


def dispatch_all_to_all(wg: Any, *args: Any, **kwargs: Any) -> Split:
    """Arguments pass through; execution then splits them if they are all per-rank lists (see split_for_ranks)."""
    return tuple(args), dict(kwargs), 0


def dispatch_dp_compute(wg: Any, *args: Any, **kwargs: Any) -> Split:
    """Each argument must be a list/tuple of world_size items; rank i gets item i (a tuple is broadcast whole by
    split_for_ranks, as in verl)."""
    for value in list(args) + list(kwargs.values()):
        if not (isinstance(value, (tuple, list)) and len(value) == wg.world_size):
            raise AssertionError(
                f"expecting a list/tuple of length world_size={wg.world_size} per argument, "
                f"got {type(value).__name__}" + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else "")
            )
    return tuple(args), dict(kwargs), 0


def _chunk(obj: Any, chunks: int) -> list:
    if not is_data_proto(obj):
        raise AssertionError(f"arg of type {type(obj)} is not chunkable")
    pieces = obj.chunk(chunks=chunks)
    if len(pieces) != chunks:
        raise AssertionError(f"chunk of {len(obj)} rows gave {len(pieces)} pieces, expected {chunks}")
    return pieces


def split_with_auto_padding(chunks: int, *args: Any, **kwargs: Any) -> Split:
    """Pad DataProtos that enable auto-padding (in place, repeating the last row, as verl) then chunk them.

    Mirrors decorator.py: _split_args_kwargs_data_proto_with_auto_padding."""
    length, pad = None, None

    def pad_and_split(obj: Any) -> list:
        nonlocal length, pad
        if not is_data_proto(obj):
            raise AssertionError(f"DP_COMPUTE_PROTO chunks DataProto arguments only, got {type(obj).__name__}")
        if obj.is_padding_enabled():
            if length is None:
                length = len(obj)
                pad = (chunks - length % chunks) if length % chunks else 0
            elif len(obj) != length:
                raise AssertionError(f"expecting all arg share same length of {length}, but got {len(obj)}")
            obj.padding(padding_size=pad)
        return obj.chunk(chunks=chunks)

    split_args = tuple(pad_and_split(a) for a in args)
    split_kwargs = {k: pad_and_split(v) for k, v in kwargs.items()}
    return split_args, split_kwargs, pad or 0


def dispatch_dp_compute_data_proto(wg: Any, *args: Any, **kwargs: Any) -> Split:
    """Chunk every DataProto into world_size pieces (auto-padding if enabled); rank i gets chunk i."""
    return split_with_auto_padding(wg.world_size, *args, **kwargs)


def dispatch_dp_compute_data_proto_with_func(wg: Any, *args: Any, **kwargs: Any) -> Split:
    """First positional argument is a function sent to every rank; the DataProtos are chunked without padding."""
    if not args or not callable(args[0]):
        raise AssertionError("DP_COMPUTE_PROTO_WITH_FUNC expects a function as the first argument")
    n = wg.world_size
    split_args = ([args[0]] * n,) + tuple(_chunk(a, n) for a in args[1:])
    return split_args, {k: _chunk(v, n) for k, v in kwargs.items()}, 0


def dispatch_nd_compute_dataproto(mesh_name: str, wg: Any, *args: Any, **kwargs: Any) -> Split:
    """Chunk by the mesh's DP size; rank i gets chunk dp_rank[i] (every TP/SP rank of a DP group the same rows).

    Mirrors decorator.py: dispatch_lazy_compute_data_proto (no auto-padding, so uneven batches give E26)."""
    mapping = wg.dispatch_info(mesh_name)
    dp_size = max(mapping) + 1
    split_args = tuple(
        [pieces[mapping[r]] for r in range(wg.world_size)] for pieces in (_chunk(a, dp_size) for a in args)
    )
    split_kwargs = {
        k: [pieces[mapping[r]] for r in range(wg.world_size)]
        for k, pieces in ((k, _chunk(v, dp_size)) for k, v in kwargs.items())
    }
    return split_args, split_kwargs, 0


def split_for_ranks(world_size: int, args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict]]:
    """Per-rank (args, kwargs): item i of each argument when every argument is a list of world_size items, else the
    same arguments for every rank. Mirrors verl/single_controller/ray/base.py: RayWorkerGroup.execute_all_async."""
    values = list(args) + list(kwargs.values())
    if all(isinstance(v, list) and len(v) == world_size for v in values):
        return (
            [tuple(a[i] for a in args) for i in range(world_size)],
            [{k: v[i] for k, v in kwargs.items()} for i in range(world_size)],
        )
    return [tuple(args)] * world_size, [dict(kwargs)] * world_size


# ---- collect functions: (wg, per-rank outputs) -> result ----------------------------------------------------------
def collect_all(wg: Any, outputs: list) -> list:
    """Per-rank outputs as a list in rank order."""
    return list(outputs)


def concat_outputs(outputs: list) -> DataProto:
    """DataProto.concat of same-typed outputs. Mirrors decorator.py: _concat_data_proto_or_future."""
    if not outputs or not is_data_proto(outputs[0]):
        raise AssertionError(
            f"expecting concatable output, but got element type {type(outputs[0]) if outputs else 'empty'}"
        )
    for o in outputs:
        if type(o) is not type(outputs[0]):
            raise AssertionError(f"outputs of mixed types: {type(o)} and {type(outputs[0])}")
    return type(outputs[0]).concat(outputs)


def collect_dp_compute_data_proto(wg: Any, outputs: list) -> DataProto:
    """Concatenate every rank's DataProto in rank order."""
    return concat_outputs(outputs)


def collect_nd_compute_dataproto(mesh_name: str, wg: Any, outputs: list) -> DataProto:
    """Keep outputs of ranks whose is_collect is true, in rank order, and concatenate them."""
    mask = wg.collect_info(mesh_name)
    return concat_outputs([o for o, keep in zip(outputs, mask) if keep])


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Any]:
    """Mesh-based dispatch of verl ≥0.6. Mirrors decorator.py: make_nd_compute_dataproto_dispatch_fn."""
    return {
        "dispatch_fn": partial(dispatch_nd_compute_dataproto, mesh_name),
        "collect_fn": partial(collect_nd_compute_dataproto, mesh_name),
        "mesh_name": mesh_name,
    }


PREDEFINED = {
    Dispatch.ONE_TO_ALL: (dispatch_one_to_all, collect_all),
    Dispatch.ALL_TO_ALL: (dispatch_all_to_all, collect_all),
    Dispatch.DP_COMPUTE: (dispatch_dp_compute, collect_all),
    Dispatch.DP_COMPUTE_PROTO: (dispatch_dp_compute_data_proto, collect_dp_compute_data_proto),
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: (dispatch_dp_compute_data_proto_with_func, collect_dp_compute_data_proto),
    Dispatch.DP_COMPUTE_METRIC: (dispatch_dp_compute_data_proto, collect_all),
}


def resolve(spec: MethodSpec) -> tuple[Callable, Callable, str | None]:
    """(dispatch_fn, collect_fn, mesh_name) for a registered method."""
    if isinstance(spec.dispatch_mode, Dispatch):
        dispatch_fn, collect_fn = PREDEFINED[spec.dispatch_mode]
        return dispatch_fn, collect_fn, None
    return spec.dispatch_mode["dispatch_fn"], spec.dispatch_mode["collect_fn"], spec.dispatch_mode.get("mesh_name")


def collected_ranks(spec: MethodSpec, wg: Any) -> list[bool]:
    """Which ranks' outputs reach the caller (for the trace)."""
    _, _, mesh_name = resolve(spec)
    if mesh_name is not None:
        return list(wg.collect_info(mesh_name))
    if spec.execute_mode is Execute.RANK_ZERO:
        return [r == 0 for r in range(wg.world_size)]
    return [True] * wg.world_size


def unpad_output(output: Any, pad: int) -> Any:
    """Drop the rows auto-padding added. Mirrors verl/single_controller/ray/base.py: func_generator."""
    if pad <= 0:
        return output
    if is_data_proto(output):
        return output.select_idxs(list(range(len(output)))[:-pad])
    if isinstance(output, list):
        return output[:-pad]
    return output
