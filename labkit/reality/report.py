"""The agreement report in words: one line per case (what happened, what labkit answered, how they compare) and the
totals, as text for the terminal and as the Markdown table the README shows."""

from __future__ import annotations

from pathlib import Path

import yaml

from labkit import __version__
from labkit.reality.score import Score, Totals

KNOWN = Path(__file__).resolve().parents[2] / "benchmarks" / "reality_known.yaml"
"""The disagreements labkit knows of, each with its cause or "not yet understood"."""


def known_disagreements() -> dict[str, dict[str, str]]:
    """``{case id: {"verdict": kind, "cause": why}}`` of ``benchmarks/reality_known.yaml``."""
    return yaml.safe_load(KNOWN.read_text()) or {}


MARK = {"agree": "agree", "false_alarm": "FALSE ALARM", "miss": "MISS", "refused": "REFUSED"}


def _happened(s: Score) -> str:
    c = s.case
    if c.outcome == "ran":
        peak = c.measured.peak_allocated_gib if c.measured else None
        return "ran" + (f", counter {peak:.1f} GiB" if peak is not None else "")
    figures = ""
    if c.oom and c.oom.tried_gib is not None:
        figures = f", tried {c.oom.tried_gib:.2f} GiB"
    return f"OOM in {c.oom.phase if c.oom else 'unknown'}{figures}"


def _answered(s: Score) -> str:
    if s.verdict == "refused":
        return f"refused: {s.answer.refusal}"
    report = s.answer.report or {}
    capacity = report.get("capacity_bytes", 0) / 2**30
    if s.verdict == "oom":
        return f"OOM in {s.first_oom} ({s.peaks_gib[s.first_oom]:.1f} of {capacity:.1f} GiB)"
    worst = max(s.peaks_gib, key=s.peaks_gib.get)
    return f"{s.verdict} (largest: {worst} {s.peaks_gib[worst]:.1f} of {capacity:.1f} GiB)"


def case_line(s: Score) -> str:
    """``id  confidence  what happened -> what labkit said  [verdict]  counter predicted/measured``."""
    counter = ""
    if s.counter_ratio is not None:
        counter = f"  counter {s.predicted_counter_gib:.1f}/{s.measured_counter_gib:.1f} GiB = {s.counter_ratio:.2f}"
    phase = "" if s.phase_agrees is None else ("; phase agrees" if s.phase_agrees else "; other phase")
    return (
        f"{s.case.id:<46} {s.case.confidence:<6} {_happened(s)} -> {_answered(s)}  [{MARK[s.agreement]}{phase}]"
        f"{counter}"
    )


def totals_lines(t: Totals) -> list[str]:
    """The totals: verdict agreement on graded and on all cases, the disagreements by kind, the counters."""
    lines = [
        f"verdict agreement, high and medium confidence: {t.agree_graded} of {t.graded} ({100 * t.agreement_graded:.0f}%)",
        f"verdict agreement, every case: {t.agree_all} of {t.cases} ({100 * t.agreement_all:.0f}%)",
        f"false alarms (a run that ran, called OOM): {len(t.false_alarms)}" + _ids(t.false_alarms),
        f"misses (an OOM called fit): {len(t.misses)}" + _ids(t.misses),
        f"refused (labkit could not answer): {len(t.refused)}" + _ids(t.refused),
        f"OOM phase named by the source and by labkit: {t.phase_agree} of {t.phase_checked} agree",
    ]
    ratios = t.ratio_summary()
    if ratios:
        lines.append(
            f"logs: predicted ÷ measured max_memory_allocated over {len(t.ratios)} logs: min {ratios[0]:.2f}, "
            f"median {ratios[1]:.2f}, max {ratios[2]:.2f}"
        )
    return lines


def _ids(ids: list[str]) -> str:
    return f": {', '.join(ids)}" if ids else ""


def markdown_table(t: Totals, date: str) -> str:
    """The README's table: the verdict agreement and the counters' estimate ÷ measured, with the date and version."""
    ratios = t.ratio_summary()
    ratio = "—" if ratios is None else f"{ratios[0]:.2f} / {ratios[1]:.2f} / {ratios[2]:.2f}"
    return "\n".join(
        [
            f"| measured {date}, labkit {__version__} | cases | agree | false alarms | misses | refused |",
            "|---|---:|---:|---:|---:|---:|",
            f"| high and medium confidence | {t.graded} | {t.agree_graded} ({100 * t.agreement_graded:.0f}%) | "
            + " | ".join(str(n) for n in _kinds(t, graded=True))
            + " |",
            f"| every case | {t.cases} | {t.agree_all} ({100 * t.agreement_all:.0f}%) | "
            + " | ".join(str(n) for n in _kinds(t, graded=False))
            + " |",
            "",
            "| logged runs | logs | estimate ÷ measured `max_memory_allocated` (min / median / max) |",
            "|---|---:|---|",
            f"| labkit's predicted counter | {len(t.ratios)} | {ratio} |",
        ]
    )


def _kinds(t: Totals, graded: bool) -> tuple[int, int, int]:
    keep = set(t.graded_ids) if graded else None
    return tuple(sum(1 for i in ids if keep is None or i in keep) for ids in (t.false_alarms, t.misses, t.refused))
