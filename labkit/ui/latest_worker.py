"""One worker thread that always runs the latest submitted job and drops older waiting ones: the dashboard's
per-rank plan (labkit.ui.dashboard) runs on it, so a fast typist never queues a backlog of stale plans."""

from __future__ import annotations

import threading
from collections.abc import Callable


class LatestWorker:
    """One thread that runs the latest submitted job; a job submitted while another runs replaces any waiting one.
    The thread ends when nothing is waiting (no thread outlives its work)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        with self._cv:
            self._job = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="labkit-dashboard", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                job, self._job = self._job, None
                if job is None:
                    self._thread = None
                    self._cv.notify_all()
                    return
            job()

    def wait(self, timeout: float = 60.0) -> bool:
        """Block until no job runs or waits (tests, a headless caller); False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._thread is None, timeout)
