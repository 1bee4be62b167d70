"""Errors a worker group raises on the driver: each names the failing rank and carries its remote traceback text.

A rank never raises across the process boundary: it returns an error envelope (labkit.runtime.rank_host.error_envelope) and
the driver turns the most telling one into an exception here."""

from __future__ import annotations

from typing import Any


class WorkerGroupError(RuntimeError):
    """Base class of the errors a worker group raises on the driver."""


class RankError(WorkerGroupError):
    """A rank raised: names the rank and method and carries the remote traceback text."""

    def __init__(
        self, envelope: dict[str, Any], others: list[dict[str, Any]] | None = None, stage: str | None = None
    ) -> None:
        self.rank, self.method, self.stage = envelope["rank"], envelope["method"], stage
        self.exc_type, self.remote_message = envelope.get("exc_type"), envelope.get("message", "")
        self.remote_traceback = envelope.get("traceback", "")
        self.collective = (envelope.get("collective") or {}).get("collective")
        self.others = [o["rank"] for o in others or []]
        where = f"{self.method} (stage {stage})" if stage and stage != self.method else self.method
        text = f"rank {self.rank} failed in {where}: {self.exc_type}: {self.remote_message}"
        if self.others:
            text += f"\n(also failed: ranks {self.others})"
        if self.remote_traceback:
            text += f"\n--- remote traceback of rank {self.rank} ---\n{self.remote_traceback.rstrip()}"
        for other in others or []:  # every other rank's hang report (stage, collective, call, stack), if it sent one
            if other.get("report_text"):
                text += "\n" + other["report_text"].rstrip()
        super().__init__(text)


class CollectiveTimeoutError(RankError):
    """A rank waited in a collective past its timeout (raised in the rank, or by the driver's watchdog)."""


class RankDiedError(RankError):
    """A rank's process or actor died during a call."""


class RankUnresponsiveError(RankError):
    """A rank answered neither its call nor a status query while its peers failed in a collective (stopped)."""


class CallTimeoutError(WorkerGroupError):
    """Ranks did not answer within timeout_s (outside any collective)."""


def root_cause(errors: list[dict[str, Any]], stage: str | None = None) -> RankError:
    """The root cause first: a plain exception, then a rank that died or stopped answering, then a collective that
    failed (peers of a dead rank fail there too: they are its symptom), a rank never heard from; then the lowest rank."""

    def order(e: dict) -> tuple:
        if e.get("pending"):
            return (3, e["rank"])
        if e.get("died") or e.get("unresponsive"):
            return (1, e["rank"])
        return (2 if e.get("collective") or e.get("pg_error") else 0, e["rank"])

    errors = sorted(errors, key=order)
    first, rest = errors[0], errors[1:]
    cls = (
        RankDiedError
        if first.get("died")
        else RankUnresponsiveError
        if first.get("unresponsive")
        else CollectiveTimeoutError
        if first.get("collective")
        else RankError
    )
    return cls(first, rest, stage)
