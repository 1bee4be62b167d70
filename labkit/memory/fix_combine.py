"""When no single knob makes the whole step fit: the cheapest set of the single fixes found that does, priced by
the same model (``labkit.memory.way_out`` says what would when none does).

Cheapest: the lowest dearest tier first (``labkit.memory.fix_candidates.KINDS``: a kernel, time, traffic, another
run), then the lowest sum of tiers, then the fewest knobs. A set is tried only when the savings its fixes make
alone could cover every phase's shortfall; at most ``MAX_TRIES`` sets are priced (each ~1 ms).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from typing import Any

from labkit.config.verl_config import VerlConfig
from labkit.memory.fix_candidates import KINDS
from labkit.memory.phase_records import Phase
from labkit.memory.settings import MemorySettings

MAX_SET, MAX_TRIES = 4, 48
OPTIMISM = 0.8
"""A set is tried when its fixes' savings, added, reach this share of each shortfall (they do not add exactly)."""

Price = Callable[[dict], tuple[VerlConfig, MemorySettings, dict[str, Phase]]]
"""The config, settings and phases after a change (``labkit.memory.verdict``'s, cached)."""
Short = Callable[[MemorySettings, Phase], bool]
Judge = Callable[[VerlConfig], bool]
"""Whether verl accepts a changed config (or rejects it only as it rejects the config itself)."""


def combined_fix(
    cfg: VerlConfig,
    s: MemorySettings,
    phases: dict[str, Phase],
    fixes: list[dict[str, Any]],
    price: Price,
    short: Short,
    accepted: Judge,
) -> dict[str, Any] | None:
    """The cheapest set of two or more of ``fixes`` (no key set twice) after which every phase fits and verl
    accepts the config, or None.
    The result: ``set`` (the overrides), ``knobs``, ``kinds``, ``costs``, ``peaks`` (every phase's new peak) and
    the changed config (``config``, for verl's verdict)."""
    need = {n: _over(s, p) for n, p in phases.items() if short(s, p)}
    if not need or any(f["step_fits"] for f in fixes):
        return None
    pool: dict[str, dict[str, Any]] = {}
    for f in fixes:  # each distinct change verl accepts that saves something where the step is short
        new_cfg, _, new_phases = price(f["change"])
        saved = _savings(phases, new_phases, need)
        if f["set"] not in pool and sum(saved.values()) > 0 and accepted(new_cfg):
            pool[f["set"]] = {"fix": f, "saved": saved, "total": sum(saved.values())}
    sets = [
        group
        for k in range(2, min(MAX_SET, len(pool)) + 1)
        for group in combinations(pool.values(), k)
        if _disjoint(group) and _could_cover(group, need)
    ]
    sets.sort(key=lambda g: (max(_tier(e) for e in g), sum(_tier(e) for e in g), len(g), -sum(e["total"] for e in g)))
    for group in sets[:MAX_TRIES]:
        change = {k: v for e in group for k, v in e["fix"]["change"].items()}
        new_cfg, new_s, new_phases = price(change)
        if not any(short(new_s, p) for p in new_phases.values()) and accepted(new_cfg):
            fixes_in = [e["fix"] for e in group]
            return {
                "set": ", ".join(f["set"] for f in fixes_in),
                "knobs": [f["knob"] for f in fixes_in],
                "kinds": [f["kind"] for f in fixes_in],
                "costs": [f["cost"] for f in fixes_in],
                "peaks": {n: p.peak_bytes for n, p in new_phases.items()},
                "config": new_cfg,
            }
    return None


def _tier(entry: dict[str, Any]) -> int:
    return KINDS.index(entry["fix"]["kind"])


def _savings(before: dict[str, Phase], after: dict[str, Phase], need: dict[str, int]) -> dict[str, int]:
    return {n: max(0, before[n].peak_bytes - after[n].peak_bytes) for n in need if n in after}


def _disjoint(group: tuple[dict[str, Any], ...]) -> bool:
    """No key (or settings field) is changed by two fixes of the set."""
    keys = [k for e in group for k in e["fix"]["change"]]
    return len(keys) == len(set(keys))


def _could_cover(group: tuple[dict[str, Any], ...], need: dict[str, int]) -> bool:
    """The set's savings, added, reach ``OPTIMISM`` of what each short phase must lose."""
    return all(sum(e["saved"].get(n, 0) for e in group) >= OPTIMISM * over for n, over in need.items())


def _over(s: MemorySettings, p: Phase) -> int:
    """Bytes the phase must lose to fit (its peak over the GPU less the margin)."""
    return max(0, p.peak_bytes - (s.gpu_bytes - s.margin_bytes))
