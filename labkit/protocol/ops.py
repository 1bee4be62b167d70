"""Helpers behind labkit.protocol.data_proto: the auto-padding switch, union rules, deep equality and TensorDict
chunking. They take plain dicts, arrays and TensorDicts, never a DataProto, so the dependency runs one way
(data_proto and rows import ops). Mirrors verl/protocol.py helpers and verl/utils/tensordict_utils.py:
chunk_tensordict."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from labkit.rules.catalogue import message

AUTO_PADDING_KEY = "_verl_auto_padding"  # same meta_info key as verl, so a DataProto means the same in both
AUTO_PADDING_ENV = "VERL_AUTO_PADDING"


class _AutoPaddingSwitch(type):
    """Class-level property `DataProtoConfig.auto_padding`. Mirrors verl/protocol.py: _DataProtoConfigMeta."""

    _enabled: bool = False

    @property
    def auto_padding(cls) -> bool:
        from_env = os.getenv(AUTO_PADDING_ENV, "FALSE").upper() in ("TRUE", "1")
        return from_env or cls._enabled

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise AssertionError(f"enabled must be a boolean, got {enabled} as {type(enabled)}")
        cls._enabled = enabled


class DataProtoConfig(metaclass=_AutoPaddingSwitch):
    """Global auto-padding switch (env VERL_AUTO_PADDING=1/TRUE or `DataProtoConfig.auto_padding = True`)."""


def dict_of_lists(rows: list[dict]) -> dict[str, list]:
    """Turn a list of dicts into a dict of lists keyed by the first dict's keys.

    Mirrors verl/utils/py_functional.py: list_of_dict_to_dict_of_list (later dicts may lack keys, not add them)."""
    if not rows:
        return {}
    out: dict[str, list] = {key: [] for key in rows[0]}
    for row in rows:
        for key, value in row.items():
            if key not in out:
                raise AssertionError(f"Key '{key}' is not present in the keys of the first dictionary in the list.")
            out[key].append(value)
    return out


def common_batch_size(tensors: dict[str, torch.Tensor], num_batch_dims: int) -> torch.Size | None:
    """Shared leading shape of all tensors (None if there are none). Mirrors the check in DataProto.from_dict."""
    pivot, batch_size = None, None
    for key, tensor in tensors.items():
        shape = tensor.shape[:num_batch_dims]
        if pivot is None:
            pivot, batch_size = key, shape
        elif shape != batch_size:
            raise AssertionError(
                f"Not all the tensor in tensors have the same batch size with batch_dims={num_batch_dims}. "
                f"Got {pivot} has {batch_size}, {key} has {shape}"
            )
    return batch_size


def merge_meta_info(metas: list[dict]) -> dict:
    """meta_info of a concat: `metrics` gathered (lists flattened, then dict of lists), other keys must agree (E44).

    Mirrors the meta merge in verl/protocol.py: DataProto.concat."""
    merged: dict[str, Any] = {}
    metrics: list = []
    for meta in metas:
        for key, val in meta.items():
            if key == "metrics":
                if isinstance(val, list):
                    metrics.extend(val)
                elif val is not None:
                    metrics.append(val)
            elif key not in merged:
                merged[key] = val
            elif not (merged[key] == val):
                raise AssertionError(f"Conflicting values for meta_info key '{key}'")
    if metrics:
        merged["metrics"] = dict_of_lists(metrics)
    return merged


def deep_equal(a: Any, b: Any, _seen: set[int] | None = None) -> bool:
    """Strict structural equality: same type, NaN equals NaN, object arrays compared element-wise, cycles tolerated.

    Mirrors verl/protocol.py: _deep_equal / _array_equal."""
    seen = set() if _seen is None else _seen
    if type(a) is not type(b):
        return False
    if id(a) in seen:
        return True
    seen.add(id(a))
    try:
        if isinstance(a, float) and math.isnan(a) and math.isnan(b):
            return True
        if isinstance(a, np.ndarray):
            if a.dtype != b.dtype or a.shape != b.shape:
                return False
            if a.dtype != object:
                return bool(np.array_equal(a, b, equal_nan=True))
            return all(deep_equal(x, y, seen) for x, y in zip(a.flat, b.flat))
        return a == b
    finally:
        seen.discard(id(a))


def union_tensor_dict(td1: TensorDict, td2: TensorDict) -> TensorDict:
    """Add td2's keys to td1 in place; shared keys must hold equal tensors. Mirrors verl/protocol.py: union_tensor_dict."""
    if td1.batch_size != td2.batch_size:
        raise AssertionError(
            f"Two tensor dict must have identical batch size. Got {td1.batch_size} and {td2.batch_size}"
        )
    for key in td2.keys():
        if key in td1.keys():
            if not td1[key].equal(td2[key]):
                raise AssertionError(f"{key} in tensor_dict1 and tensor_dict2 are not the same object")
        else:
            td1[key] = td2[key]
    return td1


def union_numpy_dict(d1: dict[str, np.ndarray], d2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add d2's arrays to d1 in place; shared keys must be deep-equal. Mirrors verl/protocol.py: union_numpy_dict."""
    for key, value in d2.items():
        if key in d1:
            if not (isinstance(value, np.ndarray) and isinstance(d1[key], np.ndarray)):
                raise AssertionError(f"`{key}` must be a numpy array on both sides of a union")
            if not deep_equal(d1[key], value):
                raise AssertionError(f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object.")
        d1[key] = value
    return d1


def union_two_dict(d1: dict, d2: dict) -> dict:
    """Add d2's items to d1 in place; shared keys must compare equal. Mirrors verl/utils/py_functional.py: union_two_dict."""
    for key, value in d2.items():
        if key in d1 and not (value == d1[key]):
            raise AssertionError(f"{key} in meta_dict1 and meta_dict2 are not the same object")
        d1[key] = value
    return d1


def _nested_from_rows(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Rebuild a nested tensor with the layout of `like` from its rows."""
    return torch.nested.as_nested_tensor(rows, layout=like.layout)


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """Split a TensorDict into `chunks` equal pieces along dim 0 (nested tensors split row-wise).

    Mirrors verl/utils/tensordict_utils.py: chunk_tensordict (E27)."""
    if not (isinstance(td, TensorDict) and len(td) % chunks == 0):
        raise AssertionError(message("E27", size=len(td), chunks=chunks))
    rows_per_chunk = len(td) // chunks
    nested = [k for k, v in td.items() if isinstance(v, torch.Tensor) and v.is_nested]
    plain = TensorDict({k: v for k, v in td.items() if k not in nested}, batch_size=td.batch_size, device=td.device)
    pieces = list(plain.chunk(chunks=chunks))
    for key in nested:
        value = td[key]
        try:
            rows = list(value.unbind(0))
        except RuntimeError:  # 3-D jagged unbind bug (pytorch#153238): go through a padded copy
            padded = value.to_padded_tensor(0)
            lengths = value.offsets().diff().tolist()
            rows = [padded[i, :n] for i, n in enumerate(lengths)]
        for i, piece in enumerate(pieces):
            piece[key] = _nested_from_rows(rows[i * rows_per_chunk : (i + 1) * rows_per_chunk], value)
    return pieces
