"""A hang read rank by rank: who waited in which collective (stage, micro-batch, call number), who left early or
raised, the count mismatch between them, and the one-line fix. Built from what each rank of the lab returned
(``labkit.hangs.worker``), the per-rank dump verl's hang triage asks users for (py-spy / NCCL_DEBUG per rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RankState:
    """Where one rank ended: "ok" (returned), "timeout" (waited past the collective timeout), "raised", "looping"."""

    rank: int
    outcome: str
    stage: str
    waiting_in: str | None = None
    call: int | None = None
    micro_batch: int | None = None
    waited_s: float | None = None
    issued: dict[str, int] = field(default_factory=dict)  # collectives entered (completed + the one it waited in)
    error: str | None = None
    stack: list[str] = field(default_factory=list)

    def line(self) -> str:
        counts = ", ".join(f"{k}×{v}" for k, v in sorted(self.issued.items())) or "no collectives"
        if self.outcome == "timeout":
            where = f"micro-batch {self.micro_batch}" if self.micro_batch is not None else "outside a micro-batch"
            return (
                f"rank {self.rank}: waited {self.waited_s or 0:.1f} s in {self.waiting_in} call #{self.call} "
                f"({self.stage}, {where}) until the timeout; issued {counts}"
            )
        if self.outcome == "raised":
            return f"rank {self.rank}: raised {self.error} in {self.stage}; issued {counts}"
        if self.outcome == "looping":
            return f"rank {self.rank}: never left {self.stage}: {self.error}"
        return f"rank {self.rank}: finished {self.stage} and returned; issued {counts}"


@dataclass
class Diagnosis:
    """The verdict on one reproduction: the rank that hung, the stage, each rank's state, the mismatch, the fix."""

    scenario: str
    title: str
    stage: str
    rank: int | None  # the (first) rank that waited past the timeout or never left the stage
    collective: str | None  # what that rank waited in
    ranks: list[RankState]
    mismatch: str
    fix: str

    def text(self) -> str:
        """The per-rank report as lines, then the mismatch and the fix."""
        head = f"hang ({self.scenario}) {self.title}: "
        if self.rank is None:
            head += f"no rank hung at {self.stage}"
        elif self.collective:
            head += f"rank {self.rank} hung at {self.stage} in {self.collective}"
        else:
            head += f"rank {self.rank} never left {self.stage}"
        lines = [head] + ["  " + r.line() for r in self.ranks]
        return "\n".join(lines + [f"  mismatch: {self.mismatch}", f"  fix: {self.fix}"])

    def __str__(self) -> str:
        return self.text()


def rank_state(result: dict[str, Any]) -> RankState:
    """One rank's returned record as a RankState (issued = completed counts + the collective it waited in)."""
    report = result.get("report") or {}
    issued = dict(result.get("counts") or {})
    waiting = report.get("waiting_in") if result["outcome"] == "timeout" else None
    if waiting:
        issued[waiting] = issued.get(waiting, 0) + 1
    return RankState(
        rank=result["rank"],
        outcome=result["outcome"],
        stage=report.get("stage") or result["stage"],
        waiting_in=waiting,
        call=report.get("call") if waiting else None,
        micro_batch=report.get("micro_batch") if waiting else None,
        waited_s=report.get("waited_s") if waiting else None,
        issued=issued,
        error=result.get("error") if result["outcome"] != "timeout" else None,
        stack=list(report.get("stack") or []),
    )


def count_mismatch(states: list[RankState]) -> str:
    """Which collective the ranks issued a different number of times, rank by rank ("" when they agree)."""
    names = sorted({k for s in states for k in s.issued})
    parts = []
    for name in names:
        per = [s.issued.get(name, 0) for s in states]
        if len(set(per)) > 1:
            parts.append(f"{name}: " + ", ".join(f"rank {s.rank} {n}" for s, n in zip(states, per)))
    return "; ".join(parts)


def diagnose(scenario: str, title: str, results: list[dict[str, Any]], fix: str, extra: str = "") -> Diagnosis:
    """The Diagnosis of one run from every rank's record; ``extra`` is appended to the mismatch (sizes, rows)."""
    states = [rank_state(r) for r in sorted(results, key=lambda r: r["rank"])]
    stuck = [s for s in states if s.outcome in ("timeout", "looping")]
    first = stuck[0] if stuck else None
    mismatch = count_mismatch(states) or "every rank issued the same collectives"
    if extra:
        mismatch = f"{mismatch}; {extra}"
    return Diagnosis(
        scenario=scenario,
        title=title,
        stage=first.stage if first else states[0].stage,
        rank=first.rank if first else None,
        collective=first.waiting_in if first else None,
        ranks=states,
        mismatch=mismatch,
        fix=fix,
    )


def timeline(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's logged events with times in seconds from the earliest start (for the per-rank plot)."""
    events = [dict(e, rank=r["rank"]) for r in results for e in r.get("log", [])]
    if not events:
        return []
    t0 = min(e["t_start"] for e in events)
    for e in events:
        e["start_s"] = e["t_start"] - t0
        e["end_s"] = (e["t_end"] if e["t_end"] is not None else e["t_start"]) - t0
    return sorted(events, key=lambda e: (e["rank"], e["start_s"]))
