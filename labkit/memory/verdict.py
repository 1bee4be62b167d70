""" "Why did it OOM?": the first phase whose peak exceeds the GPU, verl's verdict on the config, the verdict at the
expected lengths and at full width with each phase's break-even, and the fixes (``labkit.memory.fix_search``: each
a config override re-evaluated by the same model), the cheapest set of them and the way out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from labkit.config.key_effects import unpriced
from labkit.config.lengths import Uniform, check_uniform
from labkit.config.verl_config import VerlConfig
from labkit.memory.break_even import break_even
from labkit.memory.fix_combine import combined_fix
from labkit.memory.fix_search import (
    Evaluate,
    accepted,
    derived,
    fixes_for,
    priced,
    short,
    verl_error,
    verl_rejection,
)
from labkit.memory.headroom import state
from labkit.memory.model_source import PATH_KEY
from labkit.memory.phase_records import Phase
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import step_phases, trace_phases
from labkit.memory.way_out import way_out
from labkit.rules.run import Run, as_run
from labkit.trace import StepTrace

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
    run: Run | None = None
    """The resolved run this answer priced (its layout draws the answer's per-rank lines)."""

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


def first_oom(s: MemorySettings, phases: dict[str, Phase]) -> str | None:
    """The first phase (trace order) that exceeds the GPU, or whose engine cannot start."""
    return next((n for n, p in phases.items() if _fails(s, p)), None)


def memory_report(
    cfg: VerlConfig | Run,
    s: MemorySettings,
    lengths: Sequence[int] | str | None = None,
    seed: int = 0,
    trace: StepTrace | None = None,
    label: str | None = None,
) -> MemoryReport:
    """The step's phases (from the plan's micro-batches for ``lengths``, else the config's worst case: every sample
    at full width), the verdict and the fixes of every failing phase, the first failing phase's first. ``trace``:
    the plan of ``cfg`` for these lengths when the caller has it already (the dashboard); ``label``: the lengths'
    name (a profile) when ``lengths`` is the list drawn from it. A config is resolved into its run once, here;
    every fix is another run (``Run.with_values``)."""
    run = as_run(cfg)
    if lengths is None:
        evaluate: Evaluate = step_phases
    elif isinstance(lengths, Uniform):  # every sample at the given mean lengths: no plan needed

        def evaluate(c: Run, st: MemorySettings) -> dict[str, Phase]:
            return step_phases(c, st, check_uniform(lengths, st.prompt_length, st.response_length).tokens)

    else:
        from labkit.plan.step import plan

        base = trace if trace is not None else plan(run, lengths, seed=seed)  # settings-only fixes reuse it

        def evaluate(c: Run, st: MemorySettings) -> dict[str, Phase]:
            return trace_phases(base if c is run else plan(c, lengths, seed=seed), c, st)

    with run.config.recording() as reads:  # what this answer prices: the run's keys, the settings' and the phases'
        derived(run, s)
        phases = evaluate(run, s)
    not_priced = unpriced(run.config, reads | run.reads, (PATH_KEY,), run.audit_path)
    full = step_phases(run, s) if lengths is not None else phases
    rejection = verl_rejection(run)
    base_error = rejection[0] if rejection else None
    tried: dict[str, Any] = {}
    failing = [name for name, p in phases.items() if short(s, p)]
    fixes = [f for name in failing for f in fixes_for(run, s, name, evaluate, base_error, tried)]
    price = partial(priced, run, s, evaluate=evaluate, tried=tried)
    judge = partial(accepted, run, base_error)
    together = combined_fix(run, s, phases, fixes, price, short, judge) if failing else None
    if together is not None:
        together["verl_error"] = verl_error(together.pop("config"))
    stuck = failing and together is None and not any(f["step_fits"] for f in fixes)
    prompt = lengths.prompt if isinstance(lengths, Uniform) else s.prompt_length
    breaks = {n: break_even(run, s, n, prompt) for n, p in full.items() if _fails(s, p) and n != "generate"}
    if isinstance(lengths, Uniform):
        packed = ", packed rows" if s.remove_padding else ""
        how = f"{lengths.describe()} ({lengths.source}){packed}; the guarantee is priced at full width too"
        in_brief = f"expected lengths: {lengths.prompt:,} + {lengths.response:,} tokens a sample"
    elif lengths is None:
        how = "every row at full width (prompt_length + response_length): no lengths given (--lengths)"
        in_brief = "worst case: every row at full width"
    else:
        name = label or (lengths if isinstance(lengths, str) else f"given ({len(lengths):,} samples)")
        how = f"lengths {name}: the largest micro-batch on any GPU (worst case), the median one (typical case)"
        in_brief = (
            f"{label or (lengths if isinstance(lengths, str) else 'given')} lengths: the largest micro-batch on any GPU"
        )
    if not s.remove_padding:
        how += (
            "; use_remove_padding=false: every row of the training passes is padded to full width whatever the data "
            "(their lengths do not move them)"
        )
    return MemoryReport(
        s, phases, first_oom(s, phases), fixes, how, base_error, lengths_short=in_brief,
        full_width=full if lengths is not None else None, break_even=breaks, prompt_tokens=prompt,
        not_priced=not_priced, verl_message=rejection[1] if rejection else None, combined_fix=together,
        way_out=way_out(run, s, price, short, judge) if stuck else None, run=run,
    )  # fmt: skip
