"""NCCL's watchdog read rank by rank: the collective each rank waited in (its sequence number in its process group,
the op, the element counts, the timeout) and the group's last enqueued and completed work, in the formats torch
has printed (``[rank1]:[E314 ...]`` and ``[Rank7]:[T506 ...]`` prefixes; ``[PG 0 (default_pg) Rank 1]`` and
``[PG ID 4 PG GUID 12(mesh_tp) Rank 3]`` group tags; "last enqueued NCCL work: n" and "PG status: last enqueued
work: n"). The prefix's rank is the global rank; the ``[Rank r]`` inside is the rank within the group."""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit.diagnose.log_lines import LogLine


@dataclass
class NcclTimeout:
    """One rank's watchdog report: the collective it waited in (its sequence number in its process group), the
    op, the element counts, the timeout, and the group's name and last enqueued and completed work when printed.
    ``rank`` is the global rank when torch's prefix gives it, else the rank the message names."""

    rank: int
    seq: int
    op: str
    numel_in: int
    numel_out: int
    timeout_ms: int
    line: int
    group: str = ""
    last_enqueued: int | None = None
    last_completed: int | None = None
    group_rank: int | None = None


WATCHDOG = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), "
    r"OpType=(?P<op>\w+), NumelIn=(?P<nin>-?\d+), NumelOut=(?P<nout>-?\d+), Timeout\(ms\)=(?P<ms>\d+)\)"
)
RANK_TAG = re.compile(r"^\[[Rr]ank(\d+)\]:")
PG_TAG = re.compile(r"\[PG (?:ID )?(?P<pg>[^\]]*?) ?Rank (?P<rank>\d+)\]")
GROUP_WORK = re.compile(r"last enqueued (?:NCCL )?work: (?P<enq>-?\d+), last completed (?:NCCL )?work: (?P<done>-?\d+)")


def group_name(tag: str) -> str:
    """``4 PG GUID 12(mesh_tp)`` → ``mesh_tp``; ``0 (default_pg)`` → ``default_pg``; else the tag as printed."""
    m = re.search(r"\((\w+)\)\s*$", tag)
    return m.group(1) if m else tag.strip()


def _key(line: LogLine, inner: int) -> int:
    tag = RANK_TAG.match(line.text)
    return int(tag.group(1)) if tag else inner


def nccl_timeouts(lines: list[LogLine]) -> list[NcclTimeout]:
    """Every rank's watchdog timeout (the first report per rank), with its group's name and last work where
    printed."""
    found: dict[int, NcclTimeout] = {}
    for line in lines:
        m = WATCHDOG.search(line.text)
        if m:
            inner = int(m.group("rank")) if m.group("rank") else -1
            rank = _key(line, inner)
            if rank not in found:
                found[rank] = NcclTimeout(
                    rank,
                    int(m.group("seq")),
                    m.group("op"),
                    int(m.group("nin")),
                    int(m.group("nout")),
                    int(m.group("ms")),
                    line.number,
                    group_rank=inner if inner >= 0 else None,
                )
            continue
        tag, work = PG_TAG.search(line.text), GROUP_WORK.search(line.text)
        if tag and work:
            rank = _key(line, int(tag.group("rank")))
            if rank in found and found[rank].last_completed is None:
                t = found[rank]
                t.group = group_name(tag.group("pg"))
                t.last_enqueued, t.last_completed = int(work.group("enq")), int(work.group("done"))
    return sorted(found.values(), key=lambda t: t.rank)
