"""The measured memory of the log-prob head alone, next to its prediction (``labkit.memory.logprob``).

verl materialises a row of logits for every token fed to the model; a naive fp32 log-softmax
adds an fp32 copy and an fp32 result of the same size. The chunked log-prob (``logits.logprobs_from_logits_chunked``
with the LM-head weight) holds those only for ``chunk`` tokens at a time. ``PeakMeter`` measures the peak above a
starting point: the CUDA allocator's, or on Linux CPUs the process's peak RSS (VmHWM, reset via clear_refs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from labkit.memory.logprob import logprob_peak_bytes
from labkit.model.logits import logprobs_from_logits, logprobs_from_logits_chunked

__all__ = ["PeakMeter", "HeadRun", "measure_logprob_head"]


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


class PeakMeter:
    """``with PeakMeter(device) as m: ...``; then ``m.bytes`` is the peak above the start (None where this platform
    cannot tell: a CPU without /proc/self/clear_refs). On CPU, blocks under glibc's mmap threshold (at most 32 MiB)
    can reuse freed heap pages already resident, so only allocations above it are seen exactly."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.bytes: int | None = None
        self._read: Callable[[], int] | None = None

    def __enter__(self) -> PeakMeter:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            self._read = lambda: torch.cuda.max_memory_allocated() - base
            return self
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            base = _proc_status("VmRSS:")
            self._read = lambda: _proc_status("VmHWM:") - base
        except (OSError, StopIteration):
            self._read = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.bytes = None if self._read is None else self._read()


@dataclass
class HeadRun:
    """One variant of ``measure_logprob_head``: best seconds, measured and predicted peak bytes, the log-probs."""

    seconds: float
    peak_bytes: int | None
    predicted_bytes: int
    log_probs: torch.Tensor


def measure_logprob_head(
    tokens: int,
    hidden_size: int,
    vocab: int,
    chunk: int,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    reps: int = 1,
    seed: int = 0,
) -> dict[str, HeadRun]:
    """Random hidden states (tokens, hidden_size) through an LM head (vocab, hidden_size): ``naive`` = full logits,
    fp32 upcast, log_softmax, gather; ``chunked`` = ``logprobs_from_logits_chunked`` with the head's weight. Best of
    ``reps`` seconds; the peak excludes the fp32 result that is kept."""
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = (torch.randn(tokens, hidden_size, generator=gen, device=device) * 0.05).to(dtype)
    weight = (torch.randn(vocab, hidden_size, generator=gen, device=device) * 0.05).to(dtype)
    labels = torch.randint(0, vocab, (tokens,), generator=gen, device=device)
    variants = {
        "naive": (lambda: logprobs_from_logits((hidden @ weight.T).float(), labels), None),
        "chunked": (lambda: logprobs_from_logits_chunked(hidden, labels, chunk, lm_head_weight=weight), chunk),
    }
    runs: dict[str, HeadRun] = {}
    with torch.no_grad():
        for name, (fn, rows) in variants.items():
            best, peak, out = float("inf"), None, None
            for _ in range(reps):
                out = None  # free the last result before the meter starts
                with PeakMeter(device) as meter:
                    t0 = time.perf_counter()
                    out = fn()
                    if meter.cuda:
                        torch.cuda.synchronize()
                    best = min(best, time.perf_counter() - t0)
                peak = None if meter.bytes is None else meter.bytes - out.numel() * out.element_size()
            runs[name] = HeadRun(best, peak, logprob_peak_bytes(tokens, vocab, dtype.itemsize, rows), out)
    return runs
