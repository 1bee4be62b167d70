"""A rank's log of its collectives, for the per-rank timeline and the hang report: every guarded collective of
``labkit.runtime.dist`` is an event (name, group, stage, micro-batch, call number, wall-clock start and end,
outcome), labelled by the ``where`` block it ran in. Plain process state, no torch.distributed: dist writes it.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_WHERE: dict[str, Any] = {"stage": None, "micro_batch": None}
_LOG: deque = deque(maxlen=20_000)  # one event per collective, oldest dropped first
_ISSUED: Counter = Counter()  # collectives entered by name (the n-th all_gather(params) of this process)
_LAST: list[dict[str, Any]] = []  # the last collective this process completed (one element at most)
_LOCK = threading.Lock()
SKIP_IN_STACK = ("/multiprocessing/", '"<string>"', "local_launcher.py", "ray_launcher.py", "collective_log.py")


@contextmanager
def where(stage: str | None = None, micro_batch: int | None = None) -> Iterator[None]:
    """Label the collectives issued inside the block with a stage and a micro-batch index (for the log, the
    in-flight record and the per-rank report); restores the previous labels on exit."""
    previous = dict(_WHERE)
    _WHERE.update(stage=stage if stage is not None else previous["stage"], micro_batch=micro_batch)
    try:
        yield
    except BaseException as exc:  # the innermost labels travel with the exception (a raw torch collective failed)
        if not hasattr(exc, "lk_where"):
            exc.lk_where = dict(_WHERE)
        raise
    finally:
        _WHERE.update(previous)


def labels() -> dict[str, Any]:
    """The current where() labels: {"stage", "micro_batch"}."""
    return dict(_WHERE)


def collective_log(since: int = 0) -> list[dict[str, Any]]:
    """This rank's events from event number ``since`` on: the per-rank timeline of a run."""
    with _LOCK:
        return [dict(e) for e in list(_LOG)[since:]]


def log_length() -> int:
    """Events logged so far (pass it to collective_log later to get only what came after)."""
    return len(_LOG)


def begin(name: str, group: list[int] | None, rank: int | None) -> dict[str, Any]:
    """Log the start of collective ``name`` (its call number counts every entry of that name) and return the event."""
    with _LOCK:
        _ISSUED[name] += 1
        event = {
            "rank": rank,
            "collective": name,
            "group": group,
            **_WHERE,
            "call": _ISSUED[name],
            "t_start": time.time(),
            "t_end": None,
            "outcome": "waiting",
        }
        _LOG.append(event)
    return event


def end(event: dict[str, Any], outcome: str) -> None:
    """Close an event: "ok" (completed, remembered as the last one), "timeout" or "interrupted"."""
    event.update(t_end=time.time(), outcome=outcome)
    if outcome == "ok":
        _LAST[:] = [event]


def last() -> dict[str, Any] | None:
    """The last collective this process completed."""
    return dict(_LAST[0]) if _LAST else None


def note(name: str, outcome: str, t_start: float, rank: int | None, **extra: Any) -> None:
    """Log a non-collective event (a rank that raised, a loop that never advanced, a return), ending now."""
    with _LOCK:
        _LOG.append(
            {"rank": rank, "collective": name, "group": None, **_WHERE, "call": None, "t_start": t_start}
            | {"t_end": time.time(), "outcome": outcome, **extra}
        )


def _pick(frames: list[str], skip: tuple[str, ...] = ()) -> list[str]:
    """labkit's frames and the 3 innermost ones (where torch waited), innermost last, without the launcher's."""
    kept = [x for x in frames if not any(s in x for s in SKIP_IN_STACK + skip)]
    inner = set(range(len(kept) - 3, len(kept)))
    return [x for i, x in enumerate(kept) if "/labkit/" in x or i in inner][-16:]


def exception_stack(exc: BaseException) -> list[str]:
    """The frames an exception came through (``_pick``)."""
    return _pick(traceback.format_tb(exc.__traceback__))


_CALL_THREAD: int | None = None  # the thread running the rank's current call (Ray runs calls off the main thread)


def mark_call_thread() -> None:
    """Record the calling thread as the one running the rank's call (its stack is the one a report shows)."""
    global _CALL_THREAD
    _CALL_THREAD = threading.get_ident()


def main_stack(skip: tuple[str, ...] = ()) -> list[str]:
    """The Python stack of the thread running the rank's call (the main thread unless a host marked another),
    ``_pick``ed, without the frames of files named in ``skip``."""
    frame = sys._current_frames().get(_CALL_THREAD or threading.main_thread().ident)
    return _pick(traceback.format_stack(frame) if frame is not None else [], skip)
