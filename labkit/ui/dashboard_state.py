"""What the start-here dashboard shows for one input, computed once and cached: verl's verdict, the plan, the memory
of every phase and the hang risks. The same functions as ``labkit check`` / ``plan`` / ``memory`` (labkit.cli):
``validate.report.check``, ``plan.step.plan``, ``memory.verdict.memory_report``, ``plan.hang_risk``; nothing here
decides a batch rule.

Cost: ``quick`` (parse + verl's checks) takes milliseconds; the per-token plan and the hang check (dynamic
micro-batches, Karmarkar-Karp) grow with B·n: 0.1-0.3 s for 4,096 samples, 1-2 s for 32,768 on the shared 2-core
machine. Above ``INLINE_SAMPLES`` a first evaluation plans the rows only (``tokens_deferred``) and the tokens come with
``evaluate(..., tokens=True)``, which the dashboard runs next on its worker thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from labkit.config import versions
from labkit.config.launch_script import LaunchError, parse_sets
from labkit.config.lengths import LengthsError
from labkit.config.messages import ConfigError
from labkit.config.text_input import ConfigText, load_pasted_config
from labkit.config.verl_config import VerlConfig
from labkit.memory.choice import settings_for
from labkit.memory.model_source import check_shape, model_for
from labkit.memory.verdict import MemoryReport, memory_report
from labkit.plan.hang_risk import ZERO_SIZE, HangRisk, config_risks, stage_budgets, trace_risks
from labkit.plan.step import PlanTooLarge, plan
from labkit.rules.failures import StageFailure
from labkit.rules.run import Run, as_run
from labkit.trace import StepTrace
from labkit.validate.report import Report, check

INLINE_SAMPLES = 8192  # B·n planned token by token in a first evaluation
AUTO_MODEL = "auto (model.path)"
NO_LENGTHS = "none (rows only)"
_CACHE_SIZE = 32


class PlanningError(RuntimeError):
    """labkit itself failed on a config (a bug to report); the dashboard shows it as a card."""


@dataclass(frozen=True)
class Inputs:
    """Everything one dashboard state depends on (hashable: the cache key)."""

    text: str
    profile: str = "engine"
    loop: str = "v1"  # engine only: trainer.use_v1
    lengths: str = "gsm8k-like"  # a length profile, or NO_LENGTHS
    seed: int = 0
    model: str = AUTO_MODEL
    gpu: str = "H100-80GB"
    extra: tuple[str, ...] = ()  # overrides applied after the text (before the loop's trainer.use_v1)
    verl: str = ""  # a verl release (labkit.config.versions): it picks the profile and loop; "" keeps them
    sets: tuple[str, ...] = ()  # NAME=VALUE lines: shell values a script reads from its caller (--set)


@dataclass
class State:
    """One evaluated input. ``error``: labkit cannot read the config (nothing else is filled); ``too_large``: the
    step is beyond what the planner follows (only the verdict of verl's checks)."""

    inputs: Inputs
    read: ConfigText | None = None
    run: Run | None = None  # the input's config resolved once: the check, plan, hang risks and memory take it
    error: Exception | None = None
    report: Report | None = None
    trace: StepTrace | None = None
    too_large: PlanTooLarge | None = None
    tokens_deferred: bool = False
    lengths: list[int] | None = None
    memory: MemoryReport | None = None
    memory_error: str | None = None
    model_name: str = ""
    risks: list[HangRisk] = field(default_factory=list)
    dynamic: bool = False  # a stage cuts token-budget micro-batches (hangs (a) and (b) depend on the lengths)
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def cfg(self) -> VerlConfig | None:
        """The config as read (the run's own copy)."""
        return self.run.config if self.run is not None else None

    @property
    def stage_errors(self) -> dict[str, dict[str, str]]:
        return dict((self.trace.summary.get("stage_errors") or {}) if self.trace is not None else {})

    @property
    def verdict_items(self) -> list[Any]:
        """What the verdict cards show, the deciding one first: the input error, verl's first error (the Report),
        else each stage where verl stops during step 1, else the passing Report; then why labkit could not plan
        the step per rank (lengths it cannot use, a step too large), if so."""
        if self.report is None:
            return [self.error]
        if self.report.first_error is not None:
            return [self.report]
        stops = [StageFailure(e["code"], e["exc_type"], e["message"]) for e in self.stage_errors.values()]
        return (stops or [self.report]) + [x for x in (self.error, self.too_large) if x is not None]

    @property
    def code(self) -> str:
        """verl's verdict in one word: "ok" (verl runs step 1), the code of what verl raises first (at start-up,
        worker init or during step 1), or "input" (labkit cannot read the config)."""
        if self.report is None:
            return "input"
        if self.report.first_error is not None:
            return self.report.first_error.code
        return next((e["code"] for e in self.stage_errors.values()), "ok")

    @property
    def accepted(self) -> bool:
        """verl accepts the config and runs step 1 (as far as labkit plans it)."""
        return self.error is None and self.report is not None and self.report.ok and not self.stage_errors

    @property
    def samples(self) -> int:
        return self.run.geometry.samples if self.run is not None else 0


class _Lru:
    """A small least-recently-used map (the dashboard's worker thread and the kernel's thread share it, under _LOCK)."""

    def __init__(self) -> None:
        self._d: OrderedDict = OrderedDict()

    def get(self, key: Any) -> Any:
        if key not in self._d:
            return None
        self._d.move_to_end(key)
        return self._d[key]

    def put(self, key: Any, value: Any) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > _CACHE_SIZE:
            self._d.popitem(last=False)

    def clear(self) -> None:
        self._d.clear()


_LOCK = threading.Lock()
_QUICK, _STATES = _Lru(), _Lru()


def resolve_model(choice: str, cfg: VerlConfig) -> tuple[str, str | None]:
    """The model shape to price: the chosen one, or for AUTO_MODEL the one ``actor_rollout_ref.model.path`` names
    (``labkit.memory.model_source.model_for``, as ``labkit memory`` decides); ``("", why)`` when it names none."""
    try:
        return model_for(cfg, None if choice == AUTO_MODEL else choice).name, None
    except ConfigError as exc:
        return "", f"{exc} (pick a model)"


def _timed(st: State, name: str, fn: Any) -> Any:
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        st.timings_ms[name] = st.timings_ms.get(name, 0.0) + 1000 * (time.perf_counter() - t0)


def _plan(st: State, cfg: Run, tokens: bool) -> None:
    """The step's trace (per token when lengths are chosen and B·n is small enough, or when asked) and its hang
    risks (a)-(c) for the same lengths."""
    geo = cfg.geometry
    want = st.inputs.lengths != NO_LENGTHS
    st.tokens_deferred = want and not tokens and geo.samples > INLINE_SAMPLES
    if want and not st.tokens_deferred:
        st.lengths = _timed(st, "lengths", lambda: geo.lengths(st.inputs.lengths, st.inputs.seed))
    try:
        st.trace = _timed(st, "plan", lambda: plan(cfg, st.lengths))
    except PlanTooLarge as exc:
        st.too_large = exc
        return
    budgets, width = stage_budgets(cfg)
    st.dynamic = bool(budgets)
    if st.lengths is None:
        st.risks = _timed(st, "hang_risk", lambda: config_risks(cfg, None, trace=st.trace))
        return
    st.risks = _timed(st, "hang_risk", lambda: trace_risks(st.trace, st.lengths, budgets, width))


def _memory(st: State, cfg: Run) -> None:
    """Per-phase peaks, decided as ``labkit memory`` decides (``labkit.memory.choice.settings_for``): for the chosen
    lengths when the step was planned with them (worst and typical micro-batch), else every sample at full width."""
    st.model_name, note = resolve_model(st.inputs.model, cfg)
    if not st.model_name:  # never a silent default: no verdict until a model is picked
        st.memory_error = note
        return
    try:
        s = settings_for(cfg, None if st.inputs.model == AUTO_MODEL else st.model_name, st.inputs.gpu)
    except ConfigError as exc:
        st.memory_error = str(exc)
        return
    lengths = st.lengths if st.lengths is not None and st.trace is not None else None
    try:
        st.memory = _timed(
            st, "memory", lambda: memory_report(cfg, s, lengths, st.inputs.seed, st.trace, st.inputs.lengths)
        )
    except ConfigError as exc:  # a shape the Megatron memory model does not price: said where the chart goes
        st.memory_error = str(exc)


def _overrides(inputs: Inputs, rel: versions.Release | None = None) -> list[str]:
    """The extra overrides, then the loop the dashboard picks (it wins over a trainer.use_v1 in the text); a chosen
    release sets its own loop (``labkit.config.versions.apply_release``)."""
    if rel is not None:
        return list(inputs.extra)
    loop = [f"trainer.use_v1={'true' if inputs.loop == 'v1' else 'false'}"] if inputs.profile == "engine" else []
    return [*inputs.extra, *loop]


def _key(inputs: Inputs) -> tuple:
    loop = inputs.loop if inputs.profile == "engine" and not inputs.verl else ""
    return (inputs.text, inputs.extra, inputs.verl or inputs.profile, loop, inputs.sets)


def quick(inputs: Inputs) -> State:
    """Parse and verl's checks only (milliseconds; cached per text, profile and loop): the verdict an update shows
    at once. A config verl rejects is final here (its verdict replaces every figure, as ``labkit check`` stops)."""
    with _LOCK:
        hit = _QUICK.get(_key(inputs))
    if hit is not None:
        return hit
    st = State(inputs)
    try:
        rel = versions.release(inputs.verl) if inputs.verl else None
        profile = rel.profile if rel is not None else inputs.profile
        sets = parse_sets(line for line in inputs.sets if line.strip())
        config, st.read = _timed(
            st, "parse", lambda: load_pasted_config(inputs.text, profile, _overrides(inputs, rel), sets=sets)
        )
        run = st.run = as_run(versions.apply_release(config, rel))  # read once; every later answer takes the run
        st.report = _timed(st, "check", lambda: check(run, **check_shape(run)))
        first = st.report.first_error
        if first is not None and first.code in ZERO_SIZE:  # normalised to 0: early verl's split(0) hang
            st.risks = _timed(st, "hang_risk", lambda: config_risks(run, None))
    except (ConfigError, versions.VersionError, LaunchError) as exc:  # the text, a key, a value, a version
        st.error = exc
        st.read = getattr(exc, "read", st.read)  # what a script passed, listed beside the error
    except Exception as exc:  # noqa: BLE001 - a labkit bug: a card instead of a traceback in the widget log
        st.report, st.error = None, PlanningError(f"labkit failed on this config: {type(exc).__name__}: {exc}")
    with _LOCK:
        _QUICK.put(_key(inputs), st)
    return st


def final(st: State) -> bool:
    """True when ``quick``'s state is all there is to show (labkit cannot read it, or verl rejects it)."""
    return st.error is not None or (st.report is not None and st.report.first_error is not None)


def _norm(inputs: Inputs) -> Inputs:
    """The loop means nothing under the legacy profile: one cache entry whatever the loop control says."""
    return replace(inputs, loop="") if inputs.profile == "legacy" else inputs


def cached(inputs: Inputs) -> State | None:
    """The evaluated state of ``inputs`` if there is one (the per-token one first), else None."""
    inputs = _norm(inputs)
    with _LOCK:
        return _STATES.get((inputs, True)) or _STATES.get((inputs, False))


def evaluate(inputs: Inputs, tokens: bool = False) -> State:
    """The whole dashboard state of ``inputs`` (cached): ``quick``, then the plan, the hang risks and, when step 1
    runs through, the memory. ``tokens``: plan the tokens whatever B·n (the deferred per-token plan)."""
    inputs = _norm(inputs)
    hit = cached(inputs)
    if hit is not None and (hit.lengths is not None or not tokens or not hit.tokens_deferred):
        return hit
    base = quick(inputs)
    if final(base):
        return base
    st = State(inputs, read=base.read, run=base.run, report=base.report, timings_ms=dict(base.timings_ms))
    t0 = time.perf_counter()
    try:
        _plan(st, st.run, tokens)
        if st.accepted:
            _memory(st, st.run)
    except (ConfigError, LengthsError) as exc:  # lengths wider than the rollout width ...
        st.error = exc
    except Exception as exc:  # noqa: BLE001 - a labkit bug: shown as a card, never a view stuck at "planning…"
        st.error = PlanningError(f"labkit failed while planning this config: {type(exc).__name__}: {exc}")
    st.timings_ms["total"] = sum(base.timings_ms.values()) + 1000 * (time.perf_counter() - t0)
    with _LOCK:
        _STATES.put((inputs, tokens), st)
    return st


def clear_cache() -> None:
    """Forget every cached state (tests time the uncached path)."""
    with _LOCK:
        _QUICK.clear()
        _STATES.clear()
