"""The driver's watchdog over one call of a worker group: it waits for every rank's envelope and, instead of waiting
out the call's timeout, names within seconds a rank stuck in a collective past its timeout, a rank that died, one
that stopped answering while its peers failed in a collective, and peers that wait forever on a rank that raised.

What it finds makes the group unusable (``broken``). labkit's own: verl's driver waits in ray.get with no watchdog."""

from __future__ import annotations

import time
from typing import Any

from labkit.runtime.processes import process_state
from labkit.runtime.rank_errors import CallTimeoutError, root_cause
from labkit.runtime.rank_host import format_report


class CallWatchdog:
    """Waits for one call's envelopes through a launcher (poll, status); ``broken`` says why the group cannot be used
    afterwards (None while it can). grace_s: how long past a collective's own timeout, a death or a peer's failure
    the watchdog waits before it reports."""

    def __init__(
        self, launcher: Any, pids: list[int | None], timeout_s: float, collective_timeout_s: float, grace_s: float
    ) -> None:
        self.launcher, self.pids, self.grace_s = launcher, pids, grace_s
        self.timeout_s, self.collective_timeout_s = timeout_s, collective_timeout_s
        self.broken: str | None = None

    def wait(self, handle: Any, ranks: list[int], method: str, stage: str | None = None) -> dict[int, dict]:
        """Wait for every rank; the watchdog names a rank stuck in a collective past its timeout within seconds, a
        rank that died, and one that stopped answering while its peers failed in a collective."""
        t0 = time.monotonic()
        next_watch = t0 + self.collective_timeout_s
        death_seen: float | None = None
        raised_seen: float | None = None  # when a rank first raised a plain exception
        next_stuck = t0
        peers_failed: float | None = None  # when a rank first reported a failed collective
        while True:
            results = self.launcher.poll(handle, 0.1)
            if len(results) == len(ranks):
                break
            now = time.monotonic()
            pending = [r for r in ranks if r not in results]
            failed = [e for e in results.values() if not e["ok"]]
            if death_seen is None and any(e.get("died") for e in failed):
                death_seen = now
            if death_seen is not None and now - death_seen > self.grace_s:
                # a rank died: the call cannot complete; report it now rather than wait for peers that keep computing
                self.broken = "a rank died during a call"
                raise root_cause(failed + [_abandoned(r, method, "a peer died") for r in pending], stage)
            if peers_failed is None and any(e.get("collective") or e.get("pg_error") for e in failed):
                peers_failed = now
            if peers_failed is not None and now - peers_failed > self.grace_s:
                # peers gave up on a collective while these ranks never reported: a stopped rank never will
                silent = self._unresponsive(pending, method, failed)
                if silent:
                    self.broken = f"ranks {[e['rank'] for e in silent]} stopped answering"
                    answering = [r for r in pending if r not in {e["rank"] for e in silent}]
                    raise root_cause(
                        failed + silent + [_abandoned(r, method, "a peer failed") for r in answering], stage
                    )
                peers_failed = now  # the others still answer: they reach the collective and time out on their own
            raised = {e["rank"] for e in failed if not (e.get("collective") or e.get("died") or e.get("pending"))}
            raised_seen = raised_seen or (now if raised else None)
            if raised_seen is not None and now - raised_seen > self.grace_s and now >= next_stuck:
                next_stuck = now + 0.5  # peers of a raised rank that wait with no timeout (dist.waiting_on)
                stuck = [r for r, st in self.launcher.status(pending, timeout=1.0).items()
                         if ((st or {}).get("inflight") or {}).get("unbounded")
                         and raised & set(st["inflight"]["group"])]  # fmt: skip
                if stuck:
                    self.broken = f"ranks {stuck} wait forever on a peer that raised"
                    why = "it waits with no timeout on a peer that raised"
                    raise root_cause(failed + [_abandoned(r, method, why) for r in pending], stage)
            if now >= next_watch:
                next_watch = now + 0.5
                for rank, st in self.launcher.status(pending, timeout=1.0).items():
                    inf = (st or {}).get("inflight")
                    if inf and inf.get("timeout_s") is not None and inf["elapsed_s"] > inf["timeout_s"] + self.grace_s:
                        self.broken = f"rank {rank} hung in {inf['collective']}"
                        env = {
                            "ok": False,
                            "rank": rank,
                            "method": st.get("method"),
                            "exc_type": "CollectiveTimeout",
                            "message": (
                                f"driver watchdog: rank {rank} has waited {inf['elapsed_s']:.1f} s in "
                                f"collective {inf['collective']} over ranks {inf['group']} (timeout "
                                f"{inf['timeout_s']:g} s)"
                            ),
                            "collective": inf,
                            "traceback": format_report(st["report"]) if st.get("report") else "",
                        }
                        raise root_cause([env] + failed, stage)
            if now - t0 > self.timeout_s:
                self.broken = f"ranks {pending} did not answer"
                status = self.launcher.status(pending, timeout=1.0)
                stopped = [r for r in pending if r < len(self.pids) and process_state(self.pids[r] or 0) in ("T", "t")]
                raise CallTimeoutError(
                    f"ranks {pending} did not answer within {self.timeout_s:g} s"
                    + (f" (stopped, state T: ranks {stopped})" if stopped else "")
                    + f"; status: {status}"
                )
        if any(e.get("collective") or e.get("died") for e in results.values()):
            self.broken = "a rank timed out in a collective or died; its process groups are unusable"
        elif any(e.get("pg_error") for e in results.values()):
            self.broken = "a rank raised inside torch.distributed; its process groups may be out of step"
        return results

    def _unresponsive(self, ranks: list[int], method: str, failed: list[dict]) -> list[dict]:
        """Envelopes for the ranks that answer no status query (1 s each) after peers failed in a collective."""
        collectives = sorted({(e.get("collective") or {}).get("collective") or "a collective" for e in failed})
        out = []
        for rank, st in self.launcher.status(ranks, timeout=1.0).items():
            if st is not None:
                continue
            pid = self.pids[rank] if rank < len(self.pids) else None
            state = process_state(pid) if pid else None
            how = "its process is stopped (state T: SIGSTOP or a debugger)" if state in ("T", "t") else (
                "stopped, or blocked without releasing Python's GIL"
            )  # fmt: skip
            out.append(
                {
                    "ok": False,
                    "rank": rank,
                    "method": method,
                    "exc_type": "RankUnresponsive",
                    "unresponsive": True,
                    "pid": pid,
                    "message": (
                        f"rank {rank} (pid {pid}) answered neither its call nor a status query while its peers failed "
                        f"in {', '.join(collectives)}: {how}"
                    ),
                    "traceback": "",
                }
            )
        return out


def _abandoned(rank: int, method: str, why: str) -> dict[str, Any]:
    """The envelope of a rank still running when the call was given up (it sorts last among the causes)."""
    return {
        "ok": False,
        "rank": rank,
        "method": method,
        "exc_type": "Abandoned",
        "pending": True,
        "message": f"rank {rank} still running when {why}",
        "traceback": "",
    }
