"""The three lines every answer opens with, as verl's issue triage asks on every OOM report: GPU or host memory,
which phase, which config; each with the line of the log it comes from (or why the log has none)."""

from __future__ import annotations

import re

from labkit.diagnose.log_lines import LogLine

QUOTE = 110
"""Characters of a source line quoted."""


def cite(lines: list[LogLine], number: int | None) -> str:
    """``line N: <its text, cut>`` for line ``number`` of the log ("" when there is none)."""
    if number is None:
        return ""
    line = next((x for x in lines if x.number == number), None)
    if line is None:
        return f"line {number}"
    text = line.text.strip()
    return f"line {number}: {text[:QUOTE]}{'…' if len(text) > QUOTE else ''}"


def memory_line(kind: str, device: str | None, at: int | None, lines: list[LogLine], what: str = "") -> str:
    """GPU or host memory, or which failure is not a memory one, citing the failure's line; ``what`` names a failure
    that is no memory one (an exception labkit's catalogue does not know, a traceback cut before its error)."""
    src = cite(lines, at)
    where = f" ({src})" if src else ""
    if kind == "oom":
        if device == "cpu":
            return f"memory: host (the CPU allocator){where}"
        if device == "wrapped":
            return (
                "memory: not told: Ray's RayTaskError(OutOfMemoryError) wraps both torch's CUDA OOM and Ray's "
                f"host-memory kill; the worker's own lines say which{where}"
            )
        return f"memory: GPU{where}"
    if kind == "host_oom":
        return f"memory: host (Ray's memory monitor){where}"
    if kind == "unknown" and what:
        return f"memory: none named: {what}{where}"
    if kind == "unknown" and at is not None:
        return (
            "memory: not shown: a worker died without a message (most often the kernel's OOM killer, host memory)"
            f"{where}"
        )
    if kind in ("hang", "verl_error"):
        what = "an NCCL timeout" if kind == "hang" else "verl's own check"
        return f"memory: none: not a memory failure ({what}){where}"
    return "memory: no failure line in the log"


def phase_line(phase: str | None, detail: str, line: LogLine | None, lines: list[LogLine]) -> str:
    """The phase and the line that names it; "not named" only when no line does."""
    if phase is None:
        return "phase: not named (no frame, task name, driver call or memory log line in the text names one)"
    src = cite(lines, line.number) if line is not None else ""
    return f"phase: {phase}" + (f" ({detail})" if detail else "") + (f" ({src})" if src else "")


def config_line(source: str, count: int, at: int | None, lines: list[LogLine]) -> str:
    """The config found (where) or not."""
    if not source:
        return (
            "config: not found in the log (verl prints it at start; Hydra lists the overrides when a job fails): "
            "paste the log from its start, or pass the launch script with --config"
        )
    src = cite(lines, at)
    source = re.sub(r" \(line \d+\)$", "", source)
    return f"config: found, {count} override(s) from {source}" + (f" ({src})" if src else "")
