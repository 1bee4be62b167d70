"""DataProto: the batch container verl ships between driver and workers (TensorDict rows + numpy non-tensors + meta).

Holds the container itself: construction and checks, indexing, key-level operations. Its row-level operations
(chunk, concat, repeat, make_iterator, ...) come from ``labkit.protocol.rows`` and its numpy-only pickling from
``labkit.protocol.transport``, both mixins. Mirrors verl/protocol.py (verl 0.9.1): same semantics, preconditions and
error texts; pickles as numpy arrays only."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import TensorDict

from labkit.protocol.ops import (
    AUTO_PADDING_KEY,
    DataProtoConfig,
    chunk_tensordict,
    common_batch_size,
    deep_equal,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)
from labkit.protocol.rows import DataProtoRows
from labkit.protocol.transport import NumpyTransport

__all__ = [
    "DataProto",
    "DataProtoItem",
    "DataProtoConfig",
    "chunk_tensordict",
    "deep_equal",
    "union_tensor_dict",
]

Index = slice | list | np.ndarray | torch.Tensor | int | np.integer


@dataclass(eq=False)
class DataProtoItem:
    """One row of a DataProto (what `data[i]` returns). Mirrors verl/protocol.py: DataProtoItem."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass(eq=False)
class DataProto(DataProtoRows, NumpyTransport):
    """Rows with one batch dim: `batch` (TensorDict or None), `non_tensor_batch` (numpy arrays), `meta_info` (dict).

    Mirrors verl/protocol.py: DataProto."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_consistency()

    # ---- construction and checks -------------------------------------------------------------------------------
    def check_consistency(self) -> None:
        """One batch dim; every non-tensor value an ndarray with the batch's row count. Mirrors DataProto.check_consistency."""
        if self.batch is not None and len(self.batch.batch_size) != 1:
            raise AssertionError("only support num_batch_dims=1")
        for key, val in (self.non_tensor_batch or {}).items():
            if not isinstance(val, np.ndarray):
                raise AssertionError(
                    f"data in the non_tensor_batch must be a numpy.array with dtype=object, "
                    f"but for {key=}, got {type(val)=}"
                )
        if self.batch is not None and self.non_tensor_batch:
            rows = self.batch.batch_size[0]
            for key, val in self.non_tensor_batch.items():
                if val.shape[0] != rows:
                    raise AssertionError(f"key {key} length {len(val)} is not equal to batch size {rows}")

    @classmethod
    def from_single_dict(
        cls, data: dict[str, torch.Tensor | np.ndarray], meta_info: dict | None = None, auto_padding: bool = False
    ) -> DataProto:
        """Tensors go to `batch`, ndarrays to `non_tensor_batch`. Mirrors DataProto.from_single_dict."""
        tensors, non_tensors = {}, {}
        for key, val in data.items():
            if isinstance(val, torch.Tensor):
                tensors[key] = val
            elif isinstance(val, np.ndarray):
                non_tensors[key] = val
            else:
                raise ValueError(f"Unsupported type in data {type(val)}")
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info, auto_padding=auto_padding)

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict | None = None,
        meta_info: dict | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from tensors sharing dim 0; non-array non-tensors become object arrays. Mirrors DataProto.from_dict."""
        if num_batch_dims <= 0:
            raise AssertionError("num_batch_dims must be greater than zero")
        if non_tensors is not None and num_batch_dims != 1:
            raise AssertionError("only support num_batch_dims=1 when non_tensors is not None.")
        tensors = {} if tensors is None else tensors
        meta_info = {} if meta_info is None else meta_info
        non_tensors = {} if non_tensors is None else non_tensors
        if not isinstance(non_tensors, dict):
            raise AssertionError(f"non_tensors must be a dict, got {type(non_tensors)}")
        batch_size = common_batch_size(tensors, num_batch_dims)
        for key, val in non_tensors.items():
            if not isinstance(val, np.ndarray):
                non_tensors[key] = np.array(val, dtype=object)
        batch = TensorDict(source=tensors, batch_size=batch_size) if tensors else None
        if auto_padding:
            meta_info[AUTO_PADDING_KEY] = True
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    # ---- size and indexing ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self.batch is not None:
            return self.batch.batch_size[0]
        if self.non_tensor_batch:
            return next(iter(self.non_tensor_batch.values())).shape[0]
        return 0

    def __getitem__(self, item: Index) -> DataProto | DataProtoItem:
        """slice → slice(); list/ndarray/tensor → select_idxs(); int → DataProtoItem. Mirrors DataProto.__getitem__."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (list, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        if isinstance(item, (int, np.integer)):
            row = self.batch[item] if self.batch is not None else None
            return DataProtoItem(
                batch=row,
                non_tensor_batch={k: v[item] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        raise TypeError(f"Indexing with {type(item)} is not supported")

    def select_idxs(self, idxs: list | np.ndarray | torch.Tensor) -> DataProto:
        """Rows by index list/array/tensor or boolean mask (lists become int32). Mirrors DataProto.select_idxs."""
        if isinstance(idxs, list):
            as_tensor = torch.tensor(idxs)
            idxs = as_tensor if as_tensor.dtype == torch.bool else as_tensor.to(torch.int32)
        if isinstance(idxs, np.ndarray):
            idx_np, idx_t = idxs, torch.from_numpy(idxs)
        else:
            idx_t, idx_np = idxs, idxs.detach().cpu().numpy()
        rows = int(idx_np.sum()) if idx_np.dtype == bool else idx_np.shape[0]
        batch = None
        if self.batch is not None:
            batch = TensorDict(
                source={k: v[idx_t] for k, v in self.batch.items()}, batch_size=(rows,), device=self.batch.device
            )
        non_tensor = {k: v[idx_np] for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows start:end:step as a DataProto sharing meta_info. Mirrors DataProto.slice."""
        window = slice(start, end, step)
        batch = self.batch[window] if self.batch is not None else None
        return type(self)(
            batch=batch,
            non_tensor_batch={k: v[window] for k, v in self.non_tensor_batch.items()},
            meta_info=self.meta_info,
        )

    # ---- key-level operations -------------------------------------------------------------------------------------
    def select(
        self,
        batch_keys: list[str] | None = None,
        non_tensor_batch_keys: list[str] | None = None,
        meta_info_keys: list[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """Subset of keys (batch not copied; deepcopy copies non-tensors and meta). Mirrors DataProto.select."""
        batch = self.batch.select(*tuple(batch_keys)) if batch_keys is not None else self.batch
        non_tensor = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            non_tensor = {k: v for k, v in non_tensor.items() if k in non_tensor_batch_keys}
        meta = self.meta_info
        if meta_info_keys is not None:
            meta = {k: v for k, v in meta.items() if k in meta_info_keys}
        if deepcopy:
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(
        self,
        batch_keys: list[str] | None = None,
        non_tensor_batch_keys: list[str] | None = None,
        meta_info_keys: list[str] | None = None,
    ) -> DataProto:
        """Remove keys from self and return them as a new DataProto. Mirrors DataProto.pop."""
        tensors, non_tensors, meta = {}, {}, {}
        for key in batch_keys or []:
            if key not in self.batch.keys():
                raise AssertionError(f"pop: batch key {key!r} not present")
            tensors[key] = self.batch.pop(key)
        for key in non_tensor_batch_keys or []:
            if key not in self.non_tensor_batch:
                raise AssertionError(f"pop: non_tensor_batch key {key!r} not present")
            non_tensors[key] = self.non_tensor_batch.pop(key)
        for key in meta_info_keys or []:
            if key not in self.meta_info:
                raise AssertionError(f"pop: meta_info key {key!r} not present")
            meta[key] = self.meta_info.pop(key)
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)

    def rename(self, old_keys: str | list[str] | None = None, new_keys: str | list[str] | None = None) -> DataProto:
        """Rename batch keys in place. Mirrors DataProto.rename."""

        def as_list(keys):
            if keys is None or isinstance(keys, list):
                return keys
            if isinstance(keys, str):
                return [keys]
            raise TypeError(f"keys must be a list or a string, but got {type(keys)}")

        old_keys, new_keys = as_list(old_keys), as_list(new_keys)
        if len(new_keys) != len(old_keys):
            raise ValueError(
                f"new_keys and old_keys must have the same length, but got {len(new_keys)} and {len(old_keys)}"
            )
        self.batch.rename_key_(tuple(old_keys), tuple(new_keys))
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge other's keys into self in place; shared keys must agree (E44). Mirrors DataProto.union."""
        self.batch = union_tensor_dict(self.batch, other.batch)
        self.non_tensor_batch = union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        self.meta_info = union_two_dict(self.meta_info, other.meta_info)
        return self

    def to(self, device: torch.device | str) -> DataProto:
        """Move the batch to `device` in place. Mirrors DataProto.to."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def is_padding_enabled(self) -> bool:
        """Per-object meta flag or the global switch. Mirrors DataProto.is_padding_enabled."""
        return bool(self.meta_info.get(AUTO_PADDING_KEY, False)) or DataProtoConfig.auto_padding
