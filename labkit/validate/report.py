"""Every batch-size check verl performs, per profile: what it raises, when, the arithmetic, and the smallest fix.

``check(cfg)`` runs, without processes, the checks verl would run for this config in verl's own order —
start-up (``verl/utils/config.py: validate_config``), worker init (legacy ``fsdp_workers.py`` normalisation and
asserts, or the 0.9.1 ``engine_workers.py`` asserts), and step 1 (agent-loop split, ``_balance_batch``,
dispatch, micro-batching, mini-batching) — and returns a ``Report``. ``raise_for(cfg)`` raises what verl would
raise first, with verl's exact message. Rules live in ``startup`` (start-up), ``worker_init``
(worker init) and ``first_step`` (step 1); fixes in ``fixes``; the config snapshot in ``snapshot``.

A ``Finding``'s ``fixes`` are alternatives, each one Hydra-style override string (several overrides separated
by spaces, ``~key`` = back to verl's default) that was re-checked to make the whole config pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.config.verl_config import VerlConfig
from labkit.rules.geometry import BatchGeometry, legacy_normalized_mini
from labkit.rules.v1_loop import first_update_step
from labkit.validate.first_step import step_checks
from labkit.validate.fixes import FIXED, Searcher
from labkit.validate.snapshot import ERROR, NOTICE, PASS, SILENT, STEP1, Finding, Run, Snap
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
    "dp_size",
    "normalized_mini",
    "rows_per_rank",
    "mini_batch_arithmetic",
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
    cfg: VerlConfig,
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
    s = Snap(cfg, heads, kv_heads, max_seq_len, shape=shape)
    run = Run(passes)
    startup_checks(run, s)
    norm = worker_checks(run, s)
    step_checks(run, s, norm)
    warmup = first_update_step(s.critic_warmup, global_step)
    if warmup is not None and not any(c.severity == ERROR for c in run.checks):
        later = Run(passes=False)
        step_checks(later, Snap(cfg, heads, kv_heads, max_seq_len, global_step=warmup, shape=shape), norm)
        for f in later.checks:
            if f.severity == ERROR:
                f.when = f"step {warmup}" if f.when == STEP1 else f.when
                run.checks.append(f)
    return s, run.checks


def check(
    cfg: VerlConfig,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
    *,
    max_seq_len: int | None = None,
    fixes: bool = True,
    global_step: int | None = None,
    num_layers: int | None = None,
    num_experts: int | None = None,
    vocab_size: int | None = None,
) -> Report:
    """All of verl's batch-size checks for ``cfg`` (profile from the config), with verified fixes.

    Head counts enable E41/E42; ``max_seq_len`` (longest prompt+response row) makes the engine's E31 definite
    instead of a conditional notice. ``global_step``: the steps verl runs, 1..global_step (None: all of them), so a
    check of the first actor update (``trainer.critic_warmup``) is reported at its step or not at all.
    Under Megatron the head counts, ``num_layers`` (decoder layers), ``num_experts`` (MoE experts; 0: dense) and
    ``vocab_size`` (the HF vocabulary) enable megatron-core's model checks (M11-M19); None skips a check.
    """
    shape = {"layers": num_layers, "experts": num_experts, "vocab": vocab_size}
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

        searcher = Searcher(cfg, s, checks, ev, FIX_BUDGET)
        done: dict[tuple, list[str]] = {}
        others = [c for c in checks if c.code in FIXED and c.severity in (SILENT, NOTICE)]
        for f in [c for c in checks if c.severity == ERROR] + others:
            alias = (FIXED.get(f.code, f.code), f._role)
            if alias not in done and searcher.budget > 0:
                done[alias] = searcher.fixes_for(f)
            f.fixes = list(done.get(alias, []))
    return Report(cfg.profile, checks)


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


# -- normalised quantities the planner needs, per profile, never raising -----------------------------------------
def _sp(cfg: VerlConfig, role: str) -> int:
    """Ulysses size a role's DP mesh uses (the engine's critic engine always uses 1)."""
    if role == "critic":
        return cfg.get("critic.ulysses_sequence_parallel_size") if cfg.profile == "legacy" else 1
    key = "actor_rollout_ref.ref" if role == "ref" else "actor_rollout_ref.actor"
    return cfg.get(f"{key}.ulysses_sequence_parallel_size")


def dp_size(cfg: VerlConfig, role: str = "actor") -> int:
    """DP size of a role: W // sp (the engine's critic ignores critic.ulysses_sequence_parallel_size); under Megatron
    the trainer-facing DP of the actor's layout, which every colocated role runs with (0 when it does not divide)."""
    layout = BatchGeometry.from_config(cfg).parallel
    if layout.is_megatron:
        return layout.trainer_dp_size
    return cfg.n_gpus // _sp(cfg, role)


def normalized_mini(cfg: VerlConfig, role: str = "actor") -> int | None:
    """Per-rank mini-batch rows: legacy M' = (M x n) // (W // sp); engine (M x n) / D, None if not divisible."""
    M = cfg.get("critic.ppo_mini_batch_size" if role == "critic" else "actor_rollout_ref.actor.ppo_mini_batch_size")
    Mn, D = M * cfg.get("actor_rollout_ref.rollout.n"), dp_size(cfg, role)
    if D == 0:
        return None
    if cfg.profile == "legacy" and cfg.get("actor_rollout_ref.actor.strategy") == "megatron":
        return Mn // D  # megatron_workers.py: *= n, //= DP, no assert
    if cfg.profile == "legacy":
        return legacy_normalized_mini(M, cfg.get("actor_rollout_ref.rollout.n"), cfg.n_gpus, _sp(cfg, role))
    return Mn // D if Mn % D == 0 else None


def rows_per_rank(cfg: VerlConfig, role: str = "actor") -> int | None:
    """Rows each DP rank holds at step 1: B x n / D (None when not divisible: verl fails at dispatch)."""
    N, D = BatchGeometry.from_config(cfg).samples, dp_size(cfg, role)
    return N // D if D and N % D == 0 else None


def mini_batch_arithmetic(cfg: VerlConfig, role: str = "actor") -> str:
    """The normalisation as the reports write it, e.g. "M' = (60 x 12) // (6 // 1) = 120"."""
    M = cfg.get("critic.ppo_mini_batch_size" if role == "critic" else "actor_rollout_ref.actor.ppo_mini_batch_size")
    n, W, sp = cfg.get("actor_rollout_ref.rollout.n"), cfg.n_gpus, _sp(cfg, role)
    layout = BatchGeometry.from_config(cfg).parallel
    if layout.is_megatron:
        sp = layout.dp_divisor  # TP x PP x CP (dynamic CP: the trainer sees DP = 1)
    mini = normalized_mini(cfg, role)
    if cfg.profile == "legacy":
        return f"M' = ({M} x {n}) // ({W} // {sp}) = {mini}"
    shown = mini if mini is not None else f"{M * n}/{W // sp} (not whole)"
    return f"mini per rank = ({M} x {n}) / ({W} // {sp}) = {shown}"
