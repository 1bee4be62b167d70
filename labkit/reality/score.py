"""labkit's answer against what happened, case by case: the verdict (agree, false alarm, miss, refused), the phase
of an OOM, and for a log the predicted memory counter against the one verl logged.

verl logs ``perf/max_memory_allocated_gb`` = ``torch.cuda.max_memory_allocated()`` of the worker that holds the actor,
never reset. Where the rollout engine lives in that process and sleeps through vLLM's sleep mode, its weights and KV
pool are released below PyTorch's allocator, which goes on counting them: the counter reads the engine's pool plus
the training phases' own peak (``process_peak_with_pool``). Where the engine frees through the allocator or runs in
other processes (SGLang), it reads the phases' own peak (``process_peak``). Both readings are made from the same
phase terms labkit prints; the CUDA context, NCCL's buffers and the allocator's reserve are outside the counter.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from labkit.reality.ask import Answer, ask
from labkit.reality.case import Case

GiB = 2**30
OUTSIDE_ALLOCATOR = ("cuda_context", "nccl_buffers", "allocator_reserve")
"""Terms of a phase that ``max_memory_allocated`` does not count (the context, NCCL, reserved-but-unallocated)."""
ENGINE_POOL = ("rollout_weights", "kv_cache")
"""The engine's allocations that stay counted after it sleeps (its profiling activations are freed before)."""
AGREEMENTS = ("agree", "false_alarm", "miss", "refused")


@dataclass(frozen=True)
class Score:
    """One case scored: labkit's verdict, how it compares with the outcome, and the counter for a log."""

    case: Case
    answer: Answer
    verdict: str
    """``fits`` | ``fits_unless`` | ``tight`` | ``oom`` | ``refused`` (labkit could not answer: exit 2 or 3)."""
    first_oom: str | None
    agreement: str
    """``agree``; ``false_alarm`` (a run that ran, called OOM); ``miss`` (an OOM called fit); ``refused``."""
    phase_agrees: bool | None
    """An OOM whose phase the source shows: labkit's first failing phase is that phase (None: nothing to compare)."""
    peaks_gib: dict[str, float]
    predicted_counter_gib: float | None
    measured_counter_gib: float | None

    @property
    def counter_ratio(self) -> float | None:
        """Predicted ÷ measured ``max_memory_allocated`` (a log only)."""
        if self.predicted_counter_gib is None or not self.measured_counter_gib:
            return None
        return self.predicted_counter_gib / self.measured_counter_gib

    @property
    def graded(self) -> bool:
        """High- and medium-confidence cases: the ones the agreement goal is judged on."""
        return self.case.confidence in ("high", "medium")


def _allocated(phase: dict[str, Any], drop: tuple[str, ...] = ()) -> int:
    """A phase's peak as the allocator counts it: without the terms outside it (and ``drop``)."""
    return phase["peak_bytes"] - sum(v for k, v in phase["terms"].items() if k in OUTSIDE_ALLOCATOR + drop)


def predicted_counter(report: dict[str, Any], counter: str) -> float | None:
    """``max_memory_allocated`` over a whole run, in GiB, as the phases of ``report`` predict it for a counter that
    holds the slept engine's pool (``process_peak_with_pool``) or not (``process_peak``)."""
    phases = report.get("phases") or {}
    generate = phases.get("generate")
    training = [_allocated(p, ENGINE_POOL) for n, p in phases.items() if n != "generate"]
    if not training:
        return None
    pool = sum(generate["terms"].get(k, 0) for k in ENGINE_POOL) if generate else 0
    if counter == "process_peak_with_pool":
        peak = max(pool + max(training), _allocated(generate) if generate else 0)
    else:
        peak = max([*training, _allocated(generate, ENGINE_POOL) if generate else 0])
    return peak / GiB


def _verdict(answer: Answer) -> tuple[str, str | None]:
    """labkit's verdict: ``oom`` (at the lengths asked, full width without), ``fits_unless`` (fits at the lengths
    asked, not at full width), ``tight``, ``fits``, or ``refused``."""
    if answer.report is None:
        return "refused", None
    if answer.report.get("first_oom"):
        return "oom", answer.report["first_oom"]
    if answer.report.get("verdict") == "fits_unless":
        return "fits_unless", None
    tight = any(p.get("state") == "tight" for p in answer.report["phases"].values())
    return ("tight" if tight else "fits"), None


def _phase(name: str) -> str:
    """A source's phase as labkit names it (vLLM's start-up failure is the generate phase's)."""
    return "generate" if name == "startup" else name


def score(case: Case, answer: Answer | None = None) -> Score:
    """Ask labkit about ``case`` (unless ``answer`` is given) and compare."""
    answer = answer if answer is not None else ask(case)
    verdict, first = _verdict(answer)
    if verdict == "refused":
        agreement = "refused"
    elif case.outcome == "oom":
        agreement = "agree" if verdict == "oom" else "miss"
    else:
        agreement = "false_alarm" if verdict == "oom" else "agree"
    phase_agrees = None
    if case.oom is not None and case.oom.phase != "unknown" and verdict == "oom":
        phase_agrees = first == _phase(case.oom.phase)
    peaks = {n: p["peak_bytes"] / GiB for n, p in (answer.report or {}).get("phases", {}).items()}
    predicted = measured = None
    if case.measured is not None and answer.report is not None:
        predicted = predicted_counter(answer.report, case.measured.counter)
        measured = case.measured.peak_allocated_gib
    return Score(case, answer, verdict, first, agreement, phase_agrees, peaks, predicted, measured)


@dataclass(frozen=True)
class Totals:
    """The agreement over a set of scores."""

    cases: int
    graded: int
    graded_ids: list[str]
    agree_graded: int
    agree_all: int
    false_alarms: list[str]
    misses: list[str]
    refused: list[str]
    phase_checked: int
    phase_agree: int
    ratios: list[float]

    @property
    def agreement_graded(self) -> float:
        return self.agree_graded / self.graded if self.graded else 0.0

    @property
    def agreement_all(self) -> float:
        return self.agree_all / self.cases if self.cases else 0.0

    def ratio_summary(self) -> tuple[float, float, float] | None:
        """(min, median, max) of predicted ÷ measured counters, or None without logs."""
        if not self.ratios:
            return None
        return min(self.ratios), statistics.median(self.ratios), max(self.ratios)


def totals(scores: list[Score]) -> Totals:
    """The totals of ``scores``: agreement on graded (high, medium) and on all cases, and the disagreements by kind."""
    graded = [s for s in scores if s.graded]
    return Totals(
        cases=len(scores),
        graded=len(graded),
        graded_ids=[s.case.id for s in graded],
        agree_graded=sum(s.agreement == "agree" for s in graded),
        agree_all=sum(s.agreement == "agree" for s in scores),
        false_alarms=[s.case.id for s in scores if s.agreement == "false_alarm"],
        misses=[s.case.id for s in scores if s.agreement == "miss"],
        refused=[s.case.id for s in scores if s.agreement == "refused"],
        phase_checked=sum(s.phase_agrees is not None for s in scores),
        phase_agree=sum(bool(s.phase_agrees) for s in scores),
        ratios=[r for s in scores if (r := s.counter_ratio) is not None],
    )
