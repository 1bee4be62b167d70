"""DataProto's transport form: numpy only, so a pickle never carries a torch tensor (multiprocessing queues can hang on
them). bf16/fp8 travel as raw bytes, nested tensors row by row.

Holds the TensorDict <-> numpy conversion and ``NumpyTransport``, the mixin through which
labkit.protocol.data_proto.DataProto pickles (to_numpy_dict, from_numpy_dict, __getstate__, __setstate__)."""

from __future__ import annotations

from typing import Any, Self

import numpy as np
import torch
from tensordict import TensorDict


def _tensor_to_numpy(t: torch.Tensor) -> tuple[str, Any]:
    """(dtype name, payload): numpy-native dtypes travel as arrays, others (bf16, fp8) as raw bytes plus shape."""
    t = t.detach().cpu()
    name = str(t.dtype).removeprefix("torch.")
    if t.is_nested:
        return name, ("nested", str(t.layout).removeprefix("torch."), [_tensor_to_numpy(r) for r in t.unbind(0)])
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1))  # fresh buffer: unit stride, no aliasing
    try:
        return name, flat.numpy().reshape(tuple(t.shape))
    except TypeError:
        return name, ("bytes", tuple(t.shape), flat.view(torch.uint8).numpy())


def _tensor_from_numpy(name: str, payload: Any) -> torch.Tensor:
    dtype = getattr(torch, name)
    if isinstance(payload, np.ndarray):
        # Ray hands over read-only buffers; copy those instead of aliasing memory torch may not write to
        return torch.from_numpy(payload if payload.flags.writeable else payload.copy())
    if payload[0] == "nested":
        rows = [_tensor_from_numpy(n, p) for n, p in payload[2]]
        return torch.nested.as_nested_tensor(rows, layout=getattr(torch, payload[1]))
    _, shape, raw = payload
    if raw.size == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(np.ascontiguousarray(raw)).view(dtype).reshape(shape)


def tensordict_to_numpy(td: TensorDict | None) -> dict[str, Any] | None:
    """Torch-free picture of a one-batch-dim TensorDict: {"batch_size", "tensors": {key: (dtype, payload)}}."""
    if td is None:
        return None
    return {"batch_size": tuple(td.batch_size), "tensors": {k: _tensor_to_numpy(v) for k, v in td.items()}}


def tensordict_from_numpy(data: dict[str, Any] | None) -> TensorDict | None:
    """Inverse of tensordict_to_numpy (tensors land on the CPU)."""
    if data is None:
        return None
    source = {k: _tensor_from_numpy(name, payload) for k, (name, payload) in data["tensors"].items()}
    return TensorDict(source=source, batch_size=data["batch_size"])


class NumpyTransport:
    """DataProto's pickling through numpy (a mixin: the DataProto dataclass supplies the three fields)."""

    batch: TensorDict | None
    non_tensor_batch: dict
    meta_info: dict

    def to_numpy_dict(self) -> dict[str, Any]:
        """Torch-free form {"batch", "non_tensor_batch", "meta_info"}; bf16/fp8 travel as raw bytes."""
        return {
            "batch": tensordict_to_numpy(self.batch),
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    @classmethod
    def from_numpy_dict(cls, data: dict[str, Any]) -> Self:
        """Inverse of to_numpy_dict (tensors land on the CPU)."""
        return cls(
            batch=tensordict_from_numpy(data["batch"]),
            non_tensor_batch=data["non_tensor_batch"],
            meta_info=data["meta_info"],
        )

    def __getstate__(self) -> dict[str, Any]:
        return self.to_numpy_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch = tensordict_from_numpy(state["batch"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]
