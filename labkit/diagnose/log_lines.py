"""A pasted log as lines without what Ray and terminals wrap them in: ANSI colours, Ray's ``(WorkerDict pid=..,
ip=..)`` prefixes, ``[repeated 3x across cluster]`` suffixes, carriage-return progress bars, tqdm bars glued
to a traceback line. Each line keeps the
process it came from."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LOG_BYTES = 8 * 2**20
"""The largest log labkit reads (a verl run's log is mostly progress bars; the failure is near its end)."""

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\[(?:\d{1,3}(?:;\d{1,3})*)?m(?=[\s(\[{A-Za-z])")
RAY_PREFIX = re.compile(
    r"^\s*\((?P<source>(?:[\w.:<>-]+ )?pid=\d+(?:, ip=[\d.]+)?|raylet(?:, ip=[\d.]+)?|autoscaler[^)]*)\)\s?"
)
REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\].*$")
PROGRESS = re.compile(
    r"(?:[\w .()/=-]{0,60}:\s*)?\d{1,3}%\|[^|\n]{0,200}\|[^\[\]\n]{0,60}\[[^\]\n]{0,120}\]|"
    r"[█▏▎▍▌▋▊▉]+\|\s*[\d.]+[kKM]?/[\d.]+[kKM]? \[[^\]\n]{0,120}\]|\s{4,}\| [\d.]+[kKM]?/[\d.]+[kKM]? \[[^\]\n]{0,120}\]"
)
"""A tqdm progress bar, glued to a traceback or exception line when a terminal redraws it without a newline."""


class LogError(ValueError):
    """A text labkit cannot read as a log (too large, binary); one line."""


@dataclass(frozen=True)
class LogLine:
    """One line of the log: its text without prefix and colour, the Ray process it came from (``WorkerDict
    pid=123``, or "" for the driver's own lines) and its number in the pasted text (1-based)."""

    text: str
    source: str
    number: int


def log_lines(text: str) -> list[LogLine]:
    """The log's lines, cleaned; LogError for a text over ``MAX_LOG_BYTES`` or holding NUL bytes."""
    if len(text) > MAX_LOG_BYTES:
        raise LogError(f"labkit reads logs of at most {MAX_LOG_BYTES // 2**20} MiB; paste the end of the run")
    if "\x00" in text:
        raise LogError("the log holds NUL bytes: not a text log")
    out = []
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        line = ANSI.sub("", raw.rsplit("\r", 1)[-1] if "\r" in raw else raw)
        source = ""
        m = RAY_PREFIX.match(line)
        if m:
            source, line = m.group("source").split(",")[0].strip(), line[m.end() :]
        line = REPEATED.sub("", line)
        if "|" in line and "[" in line:
            bare = PROGRESS.sub(" ", line)
            line = bare if bare.strip() else line
        out.append(LogLine(line.rstrip(), source, number))
    return out
