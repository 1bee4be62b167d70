"""Every batch-size check verl performs, per profile: what it raises, when, the arithmetic, and the smallest fix.

``check(cfg)`` runs, without processes, the checks verl would run for this config in verl's own order —
start-up (``verl/utils/config.py: validate_config``), worker init (legacy ``fsdp_workers.py`` normalisation and
asserts, or the 0.9.1 ``engine_workers.py`` asserts), and step 1 (agent-loop split, ``_balance_batch``,
dispatch, micro-batching, mini-batching) — and returns a ``Report``. ``raise_for(cfg)`` raises what verl would
raise first, with verl's exact message. The rule lists live in ``startup`` (start-up), ``worker_init``
(worker init) and ``first_step`` (step 1); fixes in ``fixes``; the config snapshot in ``snapshot``; the normalised
sizes the planner reads (``dp_size``, ``normalized_mini``, ...) in ``batch_sizes``.

A ``Finding``'s ``fixes`` are alternatives, each one Hydra-style override string (several overrides separated
by spaces, ``~key`` = back to verl's default) that was re-checked to make the whole config pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.config.verl_config import VerlConfig
from labkit.rules.run import Run as ResolvedRun
from labkit.rules.run import as_run
from labkit.rules.v1_loop import first_update_step
from labkit.validate.first_step import step_checks
from labkit.validate.fixes import FIXED, Searcher
from labkit.validate.snapshot import ERROR, NOTICE, PASS, SILENT, STEP1, Finding, Recorder, Snap
from labkit.validate.startup import startup_checks
from labkit.validate.worker_init import worker_checks

__all__ = [
    "Finding",
    "Report",
    "check",
    "raise_for",
    "VerlCheckError",
    "VerlAssertionError",
    "VerlValueError",
]
FIX_BUDGET = 80  # re-checks the fix search may spend per check() call (memoised)


@dataclass
class Report:
    """Every check verl would run, in order; ``findings`` are the ones that fire (errors, silent, notices)."""

    profile: str
    checks: list[Finding] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [c for c in self.checks if c.severity != PASS]

    @property
    def errors(self) -> list[Finding]:
        return [c for c in self.checks if c.severity == ERROR]

    @property
    def silent(self) -> list[Finding]:
        return [c for c in self.checks if c.severity == SILENT]

    @property
    def notices(self) -> list[Finding]:
        return [c for c in self.checks if c.severity == NOTICE]

    @property
    def first_error(self) -> Finding | None:
        """What verl raises first (None when the config survives step 1)."""
        return next(iter(self.errors), None)

    @property
    def ok(self) -> bool:
        return not self.errors

    def arithmetic(self, code: str | None = None) -> list[str]:
        """All arithmetic lines (passed checks included), optionally for one code."""
        return [line for c in self.checks if code in (None, c.code) for line in c.arithmetic]

    def __str__(self) -> str:
        first = self.first_error
        head = (
            f"verl {self.profile}: FAILS at {first.when} - {first.exc_type}: {first.message or '(bare assert)'}"
            if first
            else f"verl {self.profile}: passes start-up, worker init and step 1"
        )
        lines = [head]
        for f in self.findings:
            lines.append(f"  [{f.code}] {f.severity} at {f.when} ({f.where})")
            if f.message and f is not first:
                lines.append(f"      {f.exc_type + ': ' if f.exc_type else ''}{f.message}")
            lines += [f"      | {a}" for a in f.arithmetic]
            lines.append(f"      {f.explanation}")
            if f.fixes:
                lines.append("      fix: " + "  OR  ".join(f.fixes))
        passed = [c for c in self.checks if c.severity == PASS and c.arithmetic and c.code in _SHOWN]
        if passed:
            lines.append("  checked:")
            lines += [f"    ok {c.code:<4} " + "; ".join(c.arithmetic) for c in passed]
        return "\n".join(lines)


_SHOWN = ("E1", "E2", "E20", "E21", "GA", "E23", "E26", "E38", "E27", "E28", "E29", "E30", "E31", "S1", "S2", "S3")
_SHOWN += ("M7", "M9", "M11", "M12", "M16", "M17", "M18", "M21", "M22", "M23")  # Megatron sizes


def _evaluate(
    cfg: VerlConfig | ResolvedRun,
    heads: int | None = None,
    kv_heads: int | None = None,
    max_seq_len: int | None = None,
    passes: bool = True,
    global_step: int | None = None,
    shape: dict | None = None,
) -> tuple[Snap, list[Finding]]:
    """Run every rule once (no fix search): start-up, worker init, step 1, and, when ``trainer.critic_warmup`` > 1
    and the step is reached (``global_step`` None: any step), the first step with an actor update: what verl
    raises there is reported at that step, after every step-1 check (verl stops at the first)."""
    s = Snap(as_run(cfg), heads, kv_heads, max_seq_len, shape=shape)
    rec = Recorder(passes)
    startup_checks(rec, s)
    norm = worker_checks(rec, s)
    step_checks(rec, s, norm)
    warmup = first_update_step(s.critic_warmup, global_step)
    if warmup is not None and not any(c.severity == ERROR for c in rec.checks):
        later = Recorder(passes=False)
        step_checks(later, Snap(s.run.at_step(warmup), heads, kv_heads, max_seq_len, shape=shape), norm)
        for f in later.checks:
            if f.severity == ERROR:
                f.when = f"step {warmup}" if f.when == STEP1 else f.when
                rec.checks.append(f)
    return s, rec.checks


def check(
    cfg: VerlConfig | ResolvedRun,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
    *,
    max_seq_len: int | None = None,
    fixes: bool = True,
    global_step: int | None = None,
    num_layers: int | None = None,
    num_experts: int | None = None,
    vocab_size: int | None = None,
    model_type: str | None = None,
    sequence_mixers: tuple[str, ...] = (),
) -> Report:
    """All of verl's batch-size checks for ``cfg`` (profile from the config; a resolved run is used as it is, a
    config resolved once), with verified fixes.

    Head counts enable E41/E42; ``max_seq_len`` (longest prompt+response row) makes the engine's E31 definite
    instead of a conditional notice. ``global_step``: the steps verl runs, 1..global_step (None: all of them), so a
    check of the first actor update (``trainer.critic_warmup``) is reported at its step or not at all.
    Under Megatron the head counts, ``num_layers`` (decoder layers), ``num_experts`` (MoE experts; 0: dense) and
    ``vocab_size`` (the HF vocabulary) enable megatron-core's model checks (M11-M19); None skips a check.
    ``model_type`` (HF) and ``sequence_mixers`` (its layers' non-attention mixers: ``linear_attention``, ``mamba``)
    say whether Ulysses reaches every layer (S10).
    """
    shape = {"layers": num_layers, "experts": num_experts, "vocab": vocab_size, "model_type": model_type,
             "mixers": sequence_mixers}  # fmt: skip
    s, checks = _evaluate(
        cfg, num_attention_heads, num_key_value_heads, max_seq_len, global_step=global_step, shape=shape
    )
    if fixes:
        memo: dict = {}

        def ev(c: VerlConfig) -> tuple[Snap, list[Finding]]:
            key = repr(sorted(c.values.items(), key=lambda kv: kv[0]))  # list values (recompute_modules) too
            if key not in memo:
                memo[key] = _evaluate(
                    c,
                    num_attention_heads,
                    num_key_value_heads,
                    max_seq_len,
                    passes=False,
                    global_step=global_step,
                    shape=shape,
                )
            return memo[key]

        searcher = Searcher(s.cfg, s, checks, ev, FIX_BUDGET)
        done: dict[tuple, list[str]] = {}
        others = [c for c in checks if c.code in FIXED and c.severity in (SILENT, NOTICE)]
        for f in [c for c in checks if c.severity == ERROR] + others:
            alias = (FIXED.get(f.code, f.code), f._role)
            if alias not in done and searcher.budget > 0:
                done[alias] = searcher.fixes_for(f)
            f.fixes = list(done.get(alias, []))
    return Report(s.profile, checks)


class VerlCheckError(Exception):
    """What verl would raise; ``str()`` is verl's exact message, ``.finding`` the full record."""

    exc_type = "Exception"

    def __init__(self, finding: Finding, config: VerlConfig | None = None, check_args: dict | None = None) -> None:
        super().__init__(finding.message)
        self.finding = finding
        self.config, self._check_args = config, dict(check_args or {})

    def fixes(self) -> list[str]:
        """The verified fixes of this error (``raise_for`` skips the search; this runs it, for the config raised on)."""
        if self.finding.fixes or self.config is None:
            return list(self.finding.fixes)
        first = check(self.config, **self._check_args).first_error
        return list(first.fixes) if first is not None and first.code == self.finding.code else []


class VerlAssertionError(VerlCheckError, AssertionError):
    exc_type = "AssertionError"


class VerlValueError(VerlCheckError, ValueError):
    exc_type = "ValueError"


class VerlTypeError(VerlCheckError, TypeError):
    exc_type = "TypeError"


class VerlZeroDivisionError(VerlCheckError, ZeroDivisionError):
    exc_type = "ZeroDivisionError"


class VerlRuntimeError(VerlCheckError, RuntimeError):
    exc_type = "RuntimeError"


class VerlNotImplementedError(VerlCheckError, NotImplementedError):
    exc_type = "NotImplementedError"


_EXC = {
    c.exc_type: c
    for c in (
        VerlAssertionError,
        VerlValueError,
        VerlTypeError,
        VerlZeroDivisionError,
        VerlRuntimeError,
        VerlNotImplementedError,
    )
}


def raise_for(
    cfg: VerlConfig,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
    *,
    max_seq_len: int | None = None,
    num_layers: int | None = None,
    num_experts: int | None = None,
    vocab_size: int | None = None,
) -> None:
    """Raise what verl raises first for this config (a subclass of verl's exception type); else return."""
    args = dict(
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_seq_len=max_seq_len,
        num_layers=num_layers,
        num_experts=num_experts,
        vocab_size=vocab_size,
    )
    first = check(cfg, **args, fixes=False).first_error
    if first is not None:
        raise _EXC.get(first.exc_type or "", VerlCheckError)(first, cfg, args)
