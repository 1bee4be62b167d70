"""The fix search of "why did it OOM?": for a phase that falls short, each knob of
``labkit.memory.fix_knobs.CANDIDATES`` (one function per family) re-evaluated by the same memory model, its smallest
change that fits and verl accepts, the new peaks, the cost and verl's verdict on the changed config. A fix is never a
value the config already has, and it says what it changes from and to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields as fields_of
from dataclasses import replace
from typing import Any

from labkit.config.keys import KEYS
from labkit.config.verl_config import VerlConfig
from labkit.memory.fix_candidates import KINDS
from labkit.memory.fix_knobs import candidates
from labkit.memory.headroom import gpu_settings, state
from labkit.memory.phase_records import Phase
from labkit.memory.settings import MemorySettings
from labkit.rules.catalogue import catalogue
from labkit.rules.run import Run, as_run
from labkit.validate.report import check


def short(s: MemorySettings, p: Phase) -> bool:
    """OOM or tight: the phase needs a fix ("fits" never means less than the margin left)."""
    return state(s, p.peak_bytes, p.info.get("engine_error"))[0] != "fits"


Evaluate = Callable[[Run, MemorySettings], dict[str, Phase]]


def _text(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _changes(run: Run, s: MemorySettings, knob: str, change: dict) -> list[tuple[str, Any, Any]]:
    """``(config key, value now, value after)`` of each part of ``change`` that changes something: a dotted key
    against the config (``None``: the key is deleted), a settings field against the settings (its config key is
    the candidate's knob)."""
    out = []
    for k, v in change.items():
        if "." not in k:
            key, now = knob, getattr(s, k)
        else:
            key, now = k, run.config.values.get(k) if v is None else run.get(k) if k in KEYS else run.raw(k)
        if now != v:
            out.append((key, now, v))
    return out


def derived(run: Run, s: MemorySettings) -> MemorySettings:
    """What the run alone makes of the settings (``labkit.memory.choice.settings_for``'s reading, default GPU)."""
    g = gpu_settings(run.geometry, None)
    g.pop("gpu_bytes")
    return MemorySettings.from_config(run, s.model, s.gpu_bytes, **g)


def _apply(run: Run, s: MemorySettings, change: dict) -> tuple[Run, MemorySettings]:
    """The config and settings after ``change``: a changed key moves every settings field it derives (the SP size
    moves the NCCL buffers too), a settings field is set as it is."""
    fields = {k: v for k, v in change.items() if "." not in k}
    keys = {k: v for k, v in change.items() if "." in k}
    new_run = run.with_values(**keys) if keys else run  # another config: another run, resolved once
    new_s = s
    if keys:
        old, new = derived(run, s), derived(new_run, s)
        moved = {f.name: getattr(new, f.name) for f in fields_of(MemorySettings)}
        new_s = replace(s, **{k: v for k, v in moved.items() if getattr(old, k) != v})
    return new_run, replace(new_s, **fields) if fields else new_s


def priced(
    run: Run, s: MemorySettings, change: dict, evaluate: Evaluate, tried: dict[str, Any]
) -> tuple[Run, MemorySettings, dict[str, Phase]]:
    """The run, settings and phases after ``change``, priced once per report (``tried``)."""
    key = repr(sorted(change.items()))
    if key not in tried:
        new_run, new_s = _apply(run, s, change)
        tried[key] = (new_run, new_s, evaluate(new_run, new_s))
    return tried[key]


def _setting(changes: list[tuple[str, Any, Any]], side: int) -> str:
    """The changes as overrides: ``side`` 2 the values after (``~key``: delete it; ``+key``: a key verl's YAML does
    not have, added into one of its open mappings), 1 the values now (``key unset`` for such a key)."""

    def one(key: str, now: Any, to: Any) -> str:
        if side == 2 and to is None:
            return f"~{key}"
        added = "." in key and key not in KEYS and now is None  # a key the YAML does not have, not set now
        if added and side == 1:
            return f"{key} unset"
        return f"{'+' if added else ''}{key}={_text(to if side == 2 else now)}"

    return ", ".join(one(*c) for c in changes)


catalogue()  # every fix is checked against verl's rules, whose messages come from the catalogue: read it once, here


def verl_error(run: Run) -> str | None:
    """The code of the first error verl raises for the run (``labkit check``'s verdict), None when it accepts: a fix
    that verl refuses is no fix."""
    rejection = verl_rejection(run)
    return None if rejection is None else rejection[0]


def verl_rejection(run: Run) -> tuple[str, str] | None:
    """``(code, verl's message)`` of the first error verl raises for the run, None when it accepts it: ``check``'s
    verdict only (no fix search), asked once per run."""

    def first() -> tuple[str, str] | None:
        error = check(run, fixes=False).first_error
        return None if error is None else (error.code, error.message)

    return run.derive("verl_rejection", first)


def accepted(run: Run, base_error: str | None, new_run: Run) -> bool:
    """verl accepts the changed run, or rejects it only as it rejects ``run`` itself."""
    return new_run is run or verl_error(new_run) in (None, base_error)


def fixes_for(
    run: Run | VerlConfig,
    s: MemorySettings,
    phase: str,
    evaluate: Evaluate,
    base_error: str | None,
    tried: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Each knob's smallest change that makes ``phase`` fit and that verl accepts (else the first that fits, else
    its best try), the new peaks, the cost, its kind and verl's verdict on the changed config (``base_error``, the
    config's own, for a change of settings only).

    A value the config already has is never offered: each fix changes something, and says what from and to
    (``set``: the overrides to pass, ``from``: the same keys as they are now, ``changes``: key, from, to; ``~key``
    deletes a key). A knob that moves the phase no lower than it is now is left out. ``tried``: the changes already
    priced for another phase of the same report (each prices the whole step), reused."""
    run = as_run(run)  # a config is read once here; a run as it is
    tried = {} if tried is None else tried
    out = []
    base = None
    for knob, tries, cost, tier in candidates(run, s, phase):
        best = None
        for change in tries:
            changes = _changes(run, s, knob, change)
            if not changes:
                continue  # the config has this value already: no fix
            new_cfg, new_s, phases = priced(run, s, change, evaluate, tried)
            if phase not in phases:
                continue
            fits = not short(new_s, phases[phase])
            if best is not None and best[2] and not fits:
                continue  # a fitting value verl refuses stays the answer unless a later one fits too
            best = (changes, phases, fits, new_s, new_cfg, change)
            if fits and accepted(run, base_error, new_cfg):
                break
        if best is None:
            continue
        changes, phases, fits, new_s, new_cfg, change = best
        if not fits:
            base = base if base is not None else evaluate(run, s)[phase].peak_bytes
            if phases[phase].peak_bytes >= base:
                continue  # this knob does not move this phase
        out.append(
            {
                "knob": knob,
                "set": _setting(changes, 2),
                "from": _setting(changes, 1),
                "changes": [{"key": k, "from": now, "to": v} for k, now, v in changes],
                "phase": phase,
                "new_peak_bytes": phases[phase].peak_bytes,
                "fits": fits,
                "step_fits": not any(short(new_s, p) for p in phases.values()),
                "cost": cost,
                "kind": KINDS[tier],
                "verl_error": base_error if new_cfg is run else verl_error(new_cfg),
                "change": change,
            }
        )
    out.sort(key=lambda f: (not f["fits"], not f["step_fits"], KINDS.index(f["kind"]), f["new_peak_bytes"]))
    return out
