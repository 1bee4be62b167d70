"""The break-even of a phase: the longest response at which it still fits, every sample that long (packed rows).

A phase that OOMs with every row at full width may fit at the lengths a run really sees; the break-even says how
long responses may grow before it does not. It exists only where the micro-batch follows the lengths: packed rows
(``use_remove_padding``) with a static micro-batch, or a dynamic budget the samples do not fill. A padded row is full
width whatever its sample, and a phase whose model states alone exceed the GPU has none.
"""

from __future__ import annotations

from typing import Any

from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import step_phases


def _fits(cfg: Any, s: MemorySettings, phase: str, tokens: int) -> bool:
    p = step_phases(cfg, s, tokens)[phase]
    return p.peak_bytes <= s.gpu_bytes and not p.info.get("engine_error")


def break_even(cfg: Any, s: MemorySettings, phase: str, prompt: int) -> int | None:
    """The longest response (tokens, at most rollout.response_length) with which ``phase`` fits when every sample
    is ``prompt`` + that many tokens; None when it does not fit even with a 1-token response, or when the lengths
    do not move it (it then fails or fits at every length)."""
    width = s.response_length
    if phase == "generate" or _fits(cfg, s, phase, prompt + width):
        return None
    if not _fits(cfg, s, phase, prompt + 1):
        return None
    lo, hi = 1, width  # fits at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(cfg, s, phase, prompt + mid) else (lo, mid)
    return lo
