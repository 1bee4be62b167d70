"""verl's dispatch and collect rules on the driver: how each dispatch mode splits a call's arguments over the ranks,
how their outputs are collected, and what a rank holds (rows, tokens) for the trace.

Pure functions of the driver's arguments and the ranks' registered dispatch info; no processes are started here. The
modes themselves and ``register`` are in ``labkit.runtime.worker``. Mirrors verl/single_controller/base/decorator.py
(semantics, not code)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from labkit.runtime.worker import Dispatch, Execute, MethodSpec

if TYPE_CHECKING:
    from labkit.protocol.data_proto import DataProto


def is_data_proto(obj: Any) -> bool:
    """isinstance(obj, DataProto) without importing labkit.protocol.data_proto (tensordict pulls torch._dynamo, ~2 CPU-s per
    rank): an object can only be a DataProto once its module is loaded, e.g. by unpickling one."""
    mod = sys.modules.get("labkit.protocol.data_proto")
    return mod is not None and isinstance(obj, mod.DataProto)


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
