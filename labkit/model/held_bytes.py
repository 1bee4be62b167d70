"""What a piece of work leaves allocated: the bytes of the storages created under ``HeldBytes`` that are still alive,
per device type, rounded to the CUDA caching allocator's 512-byte blocks. The LoRA adapters' model states
(``labkit.model.trace_lora``) and megatron-core's optimizer after a step (``labkit.model.trace_megatron_optimizer``)
are counted with it, on fake tensors."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

BLOCK = 512


class HeldBytes(TorchDispatchMode):
    """Storages created under it until they die; views and in-place ops create none (their output aliases an
    input, made before or counted already)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[str, int]] = {}

    def _free(self, key: int) -> None:
        self.live.pop(key, None)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self.live or st.nbytes() == 0:
                continue
            self.live[key] = (t.device.type, -(-st.nbytes() // BLOCK) * BLOCK)
            weakref.finalize(st, self._free, key)
        return out

    def held(self, device: str | None = None) -> int:
        """Bytes alive now on ``device`` (cuda, cpu; None: every device)."""
        return sum(n for d, n in self.live.values() if device in (None, d))
