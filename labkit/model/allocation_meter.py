"""An allocator-level peak meter: every allocation and free that torch's allocator reports to the profiler.

``with AllocationMeter() as m: ...`` then ``m.peak_bytes`` is the highest sum of live bytes allocated inside the block
(the blocks allocated before it do not count; those freed inside it count negatively). Exact on CPU (unlike the
process's RSS, which glibc's heap reuse hides); on CUDA it reads the caching allocator's own counters
(``max_memory_allocated`` above ``memory_allocated`` at entry: allocations, not reservations).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["AllocationMeter"]


@contextmanager
def _without_native_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for a moment: the profiler's C++ side prints "USDT ... profiler_start/stop"
    lines at every start and stop whatever KINETO_LOG_LEVEL says (a red stderr block in a notebook)."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class AllocationMeter:
    """Peak and final bytes allocated within a ``with`` block, from the profiler's memory events on ``device``."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.peak_bytes = 0
        self.final_bytes = 0
        self._prof: profile | None = None
        self._base = 0

    def __enter__(self) -> AllocationMeter:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
        with _without_native_stderr():
            self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._base
            self.final_bytes = torch.cuda.memory_allocated() - self._base
            return
        assert self._prof is not None
        with _without_native_stderr():
            self._prof.__exit__(None, None, None)
        events = sorted(
            (e.start_ns(), e.nbytes())
            for e in self._prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and str(e.device_type()).lower().endswith("cpu")
        )
        live = peak = 0
        for _, nbytes in events:
            live += nbytes
            peak = max(peak, live)
        self.peak_bytes, self.final_bytes = peak, live
        self._prof = None
