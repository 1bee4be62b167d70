""" "Why did it OOM?": the first phase whose peak exceeds the GPU, and the verl knobs that would fix it, each with
its new predicted peak and what it costs. A fix is a config override re-evaluated by the same model (no guessing),
never a value the config already has, and it says what it changes from and to. The knobs tried are
``labkit.memory.fix_knobs.CANDIDATES`` (one function per family of knobs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from dataclasses import fields as fields_of
from functools import partial
from typing import Any

from labkit.config.key_effects import unpriced
from labkit.config.keys import KEYS
from labkit.config.lengths import Uniform, check_uniform
from labkit.config.verl_config import VerlConfig
from labkit.memory.break_even import break_even
from labkit.memory.fix_candidates import KINDS
from labkit.memory.fix_combine import combined_fix
from labkit.memory.fix_knobs import candidates
from labkit.memory.headroom import gpu_settings, state
from labkit.memory.model_source import PATH_KEY
from labkit.memory.phases import Phase
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import step_phases, trace_phases
from labkit.memory.way_out import way_out
from labkit.rules.catalogue import catalogue
from labkit.trace import StepTrace
from labkit.validate.report import check

GiB = 2**30


@dataclass
class MemoryReport:
    """Per-phase peaks of one step on one GPU, the first phase over capacity, and the fixes."""

    settings: MemorySettings
    phases: dict[str, Phase]
    first_oom: str | None
    fixes: list[dict[str, Any]]
    lengths: str = "every row at full width (prompt_length + response_length)"
    """The length assumption the verdict rests on."""
    verl_error: str | None = None
    """The code of the error verl raises for the config itself (None: it accepts it); each fix has its own."""
    verl_message: str | None = None
    """verl's own message for ``verl_error`` (what an answer says first)."""
    lengths_short: str = "worst case: every row at full width"
    """The same assumption in a few words (a figure's title)."""
    full_width: dict[str, Phase] | None = None
    """With lengths given: the phases at full width as well (the guarantee); None when ``phases`` are those."""
    break_even: dict[str, int | None] = field(default_factory=dict)
    """Each phase that does not fit at full width: the longest response (tokens) at which it still fits, every
    sample that long (``labkit.memory.break_even``); None where the lengths do not move it."""
    prompt_tokens: int = 0
    """The prompt length the break-even assumes (the given lengths' prompt, else data.max_prompt_length)."""
    not_priced: list[dict[str, str]] = field(default_factory=list)
    """Every key the config sets that this answer did not read, with its effect (``labkit.config.key_effects``)."""
    combined_fix: dict[str, Any] | None = None
    """When no single fix makes the whole step fit: the cheapest set of them that does (``fix_combine``)."""
    way_out: str | None = None
    """When no fix does, alone or together: what would (more nodes, a larger GPU), or that nothing labkit knows."""

    @property
    def first_oom_full_width(self) -> str | None:
        """The first phase that OOMs with every row at full width."""
        return first_oom(self.settings, self.full_width) if self.full_width is not None else self.first_oom

    @property
    def verdict(self) -> str:
        """``fits`` (even at full width), ``fits_unless`` (at the expected lengths, not at full width: see
        ``break_even``) or ``oom`` (at the expected lengths; at full width when none are given)."""
        if self.first_oom is not None:
            return "oom"
        return "fits" if self.first_oom_full_width is None else "fits_unless"

    def state(self, name: str) -> tuple[str, int]:
        """``("fits" | "tight" | "OOM", bytes left)`` of one phase (``labkit.memory.headroom.state``)."""
        p = self.phases[name]
        return state(self.settings, p.peak_bytes, p.info.get("engine_error"))

    def to_dict(self, details: bool = False) -> dict[str, Any]:
        """``{"phases": {NAME: {"peak_bytes": int, "terms": {TERM: bytes}}}, "first_oom": NAME|null, "fixes": [...]}``
        (``labkit memory --json``); ``details`` adds each phase's peak instant and derived facts, and the model,
        GPU and profile."""
        phases: dict[str, dict[str, Any]] = {}
        for n, p in self.phases.items():
            verdict, left = self.state(n)
            phases[n] = {"peak_bytes": p.peak_bytes, "terms": p.terms, "state": verdict, "left_bytes": left}
            if details:
                phases[n].update(peak_instant=p.peak_instant, info=p.info)
        out: dict[str, Any] = {
            "phases": phases,
            "verdict": self.verdict,
            "first_oom": self.first_oom,
            "first_oom_full_width": self.first_oom_full_width,
            "break_even": {
                n: {"response_tokens": v, "prompt_tokens": self.prompt_tokens} for n, v in self.break_even.items()
            },
            "fixes": [{k: v for k, v in f.items() if k != "change"} for f in self.fixes],
            "capacity_bytes": self.settings.gpu_bytes,
            "margin_bytes": self.settings.margin_bytes,
            "lengths": self.lengths,
            "verl_error": self.verl_error,
            "verl_message": self.verl_message,
            "not_priced": self.not_priced,
            "combined_fix": self.combined_fix,
            "way_out": self.way_out,
        }
        if details:
            out.update(model=self.settings.model.name, gpu_bytes=self.settings.gpu_bytes, profile=self.settings.profile)
        return out


def _fails(s: MemorySettings, p: Phase) -> bool:
    return p.peak_bytes > s.gpu_bytes or bool(p.info.get("engine_error"))


def _short(s: MemorySettings, p: Phase) -> bool:
    """OOM or tight: the phase needs a fix ("fits" never means less than the margin left)."""
    return state(s, p.peak_bytes, p.info.get("engine_error"))[0] != "fits"


def first_oom(s: MemorySettings, phases: dict[str, Phase]) -> str | None:
    """The first phase (trace order) that exceeds the GPU, or whose engine cannot start."""
    return next((n for n, p in phases.items() if _fails(s, p)), None)


Evaluate = Callable[[VerlConfig, MemorySettings], dict[str, Phase]]


def _with(cfg: VerlConfig, **values: Any) -> VerlConfig:
    """``cfg`` with ``values`` set (its release, ignored and added keys kept: they price too)."""
    out = cfg.copy()
    out.values.update(values)
    return out


def _text(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _changes(cfg: VerlConfig, s: MemorySettings, knob: str, change: dict) -> list[tuple[str, Any, Any]]:
    """``(config key, value now, value after)`` of each part of ``change`` that changes something: a dotted key
    against the config (``None``: the key is deleted), a settings field against the settings (its config key is
    the candidate's knob)."""
    out = []
    for k, v in change.items():
        if "." not in k:
            key, now = knob, getattr(s, k)
        else:
            key, now = k, cfg.values.get(k) if v is None else cfg.get(k) if k in KEYS else cfg.raw(k)
        if now != v:
            out.append((key, now, v))
    return out


def _derived(cfg: VerlConfig, s: MemorySettings) -> MemorySettings:
    """What ``cfg`` alone makes of the settings (``labkit.memory.choice.settings_for``'s reading, default GPU)."""
    g = gpu_settings(cfg, None)
    g.pop("gpu_bytes")
    return MemorySettings.from_config(cfg, s.model, s.gpu_bytes, **g)


def _apply(cfg: VerlConfig, s: MemorySettings, change: dict) -> tuple[VerlConfig, MemorySettings]:
    """The config and settings after ``change``: a changed key moves every settings field it derives (the SP size
    moves the NCCL buffers too), a settings field is set as it is."""
    fields = {k: v for k, v in change.items() if "." not in k}
    keys = {k: v for k, v in change.items() if "." in k}
    new_cfg = _with(cfg, **keys) if keys else cfg
    new_s = s
    if keys:
        old, new = _derived(cfg, s), _derived(new_cfg, s)
        moved = {f.name: getattr(new, f.name) for f in fields_of(MemorySettings)}
        new_s = replace(s, **{k: v for k, v in moved.items() if getattr(old, k) != v})
    return new_cfg, replace(new_s, **fields) if fields else new_s


def _priced(
    cfg: VerlConfig, s: MemorySettings, change: dict, evaluate: Evaluate, tried: dict[str, Any]
) -> tuple[VerlConfig, MemorySettings, dict[str, Phase]]:
    """The config, settings and phases after ``change``, priced once per report (``tried``)."""
    key = repr(sorted(change.items()))
    if key not in tried:
        new_cfg, new_s = _apply(cfg, s, change)
        tried[key] = (new_cfg, new_s, evaluate(new_cfg, new_s))
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


def verl_error(cfg: VerlConfig) -> str | None:
    """The code of the first error verl raises for ``cfg`` (``labkit check``'s verdict), None when it accepts: a fix
    that verl refuses is no fix."""
    first = check(cfg).first_error
    return None if first is None else first.code


def verl_rejection(cfg: VerlConfig) -> tuple[str, str] | None:
    """``(code, verl's message)`` of the first error verl raises for ``cfg``, None when it accepts it."""
    first = check(cfg).first_error
    return None if first is None else (first.code, first.message)


def _accepted(cfg: VerlConfig, base_error: str | None, new_cfg: VerlConfig) -> bool:
    """verl accepts the changed config, or rejects it only as it rejects ``cfg`` itself."""
    return new_cfg is cfg or verl_error(new_cfg) in (None, base_error)


def fixes_for(
    cfg: VerlConfig,
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
    tried = {} if tried is None else tried
    out = []
    base = None
    for knob, tries, cost, tier in candidates(cfg, s, phase):
        best = None
        for change in tries:
            changes = _changes(cfg, s, knob, change)
            if not changes:
                continue  # the config has this value already: no fix
            new_cfg, new_s, phases = _priced(cfg, s, change, evaluate, tried)
            if phase not in phases:
                continue
            fits = not _short(new_s, phases[phase])
            if best is not None and best[2] and not fits:
                continue  # a fitting value verl refuses stays the answer unless a later one fits too
            best = (changes, phases, fits, new_s, new_cfg, change)
            if fits and _accepted(cfg, base_error, new_cfg):
                break
        if best is None:
            continue
        changes, phases, fits, new_s, new_cfg, change = best
        if not fits:
            base = base if base is not None else evaluate(cfg, s)[phase].peak_bytes
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
                "step_fits": not any(_short(new_s, p) for p in phases.values()),
                "cost": cost,
                "kind": KINDS[tier],
                "verl_error": base_error if new_cfg is cfg else verl_error(new_cfg),
                "change": change,
            }
        )
    out.sort(key=lambda f: (not f["fits"], not f["step_fits"], KINDS.index(f["kind"]), f["new_peak_bytes"]))
    return out


def memory_report(
    cfg: VerlConfig,
    s: MemorySettings,
    lengths: Sequence[int] | str | None = None,
    seed: int = 0,
    trace: StepTrace | None = None,
    label: str | None = None,
) -> MemoryReport:
    """The step's phases (from the plan's micro-batches for ``lengths``, else the config's worst case: every sample
    at full width), the verdict and the fixes of every failing phase, the first failing phase's first. ``trace``:
    the plan of ``cfg`` for these lengths when the caller has it already (the dashboard); ``label``: the lengths'
    name (a profile) when ``lengths`` is the list drawn from it."""
    if lengths is None:
        evaluate: Evaluate = step_phases
    elif isinstance(lengths, Uniform):  # every sample at the given mean lengths: no plan needed

        def evaluate(c: VerlConfig, st: MemorySettings) -> dict[str, Phase]:
            return step_phases(c, st, check_uniform(lengths, st.prompt_length, st.response_length).tokens)

    else:
        from labkit.plan.step import plan

        base = trace if trace is not None else plan(cfg, lengths, seed=seed)  # settings-only fixes reuse it

        def evaluate(c: VerlConfig, st: MemorySettings) -> dict[str, Phase]:
            return trace_phases(base if c is cfg else plan(c, lengths, seed=seed), c, st)

    with cfg.recording() as reads:  # what this answer prices: the settings' keys and the phases'
        _derived(cfg, s)
        phases = evaluate(cfg, s)
    not_priced = unpriced(cfg, reads, (PATH_KEY,))
    full = step_phases(cfg, s) if lengths is not None else phases
    rejection = verl_rejection(cfg)
    base_error = rejection[0] if rejection else None
    tried: dict[str, Any] = {}
    failing = [name for name, p in phases.items() if _short(s, p)]
    fixes = [f for name in failing for f in fixes_for(cfg, s, name, evaluate, base_error, tried)]
    price = partial(_priced, cfg, s, evaluate=evaluate, tried=tried)
    accepted = partial(_accepted, cfg, base_error)
    together = combined_fix(cfg, s, phases, fixes, price, _short, accepted)
    if together is not None:
        together["verl_error"] = verl_error(together.pop("config"))
    stuck = failing and together is None and not any(f["step_fits"] for f in fixes)
    prompt = lengths.prompt if isinstance(lengths, Uniform) else s.prompt_length
    breaks = {n: break_even(cfg, s, n, prompt) for n, p in full.items() if _fails(s, p) and n != "generate"}
    if isinstance(lengths, Uniform):
        packed = ", packed rows" if s.remove_padding else ""
        how = f"{lengths.describe()} ({lengths.source}){packed}; the guarantee is priced at full width too"
        short = f"expected lengths: {lengths.prompt:,} + {lengths.response:,} tokens a sample"
    elif lengths is None:
        how = "every row at full width (prompt_length + response_length): no lengths given (--lengths)"
        short = "worst case: every row at full width"
    else:
        name = label or (lengths if isinstance(lengths, str) else f"given ({len(lengths):,} samples)")
        how = f"lengths {name}: the largest micro-batch on any GPU (worst case), the median one (typical case)"
        short = (
            f"{label or (lengths if isinstance(lengths, str) else 'given')} lengths: the largest micro-batch on any GPU"
        )
    if not s.remove_padding:
        how += (
            "; use_remove_padding=false: every row of the training passes is padded to full width whatever the data "
            "(their lengths do not move them)"
        )
    return MemoryReport(
        s, phases, first_oom(s, phases), fixes, how, base_error, lengths_short=short,
        full_width=full if lengths is not None else None, break_even=breaks, prompt_tokens=prompt,
        not_priced=not_priced, verl_message=rejection[1] if rejection else None, combined_fix=together,
        way_out=way_out(cfg, s, price, _short, accepted) if stuck else None,
    )  # fmt: skip
