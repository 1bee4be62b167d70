"""Rank processes seen from /proc (no psutil): whether one is alive, its state letter, how it ended, waiting until a
group's are gone; and a local rank's own watch on its driver (it exits once the driver is gone)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from multiprocessing import process as mp_process

from labkit.runtime import rank_files


def exit_text(code: int | None) -> str:
    """How a process ended, from multiprocessing's exitcode (negative: the signal that killed it)."""
    if code is None:
        return "died (exit code unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R running, S sleeping, T stopped, Z zombie...); None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True while /proc/<pid> exists and is not a zombie."""
    return process_state(pid) not in (None, "Z")


def wait_gone(pids: list[int], timeout_s: float) -> None:
    """Wait until every pid is gone; SIGKILL the rank processes still there after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in (p for p in pids if pid_alive(p)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


DRIVER_POLL_S = 0.5  # how often a rank checks that its driver is still alive


def exit_without_driver(driver_pid: int, driver_tempdir: str | None) -> None:
    """Exit this rank once its driver is gone: a SIGKILLed driver cannot close its ranks, and a rank busy in a call
    never reads the pipe that would tell it (os._exit: no cleanup can be trusted without the driver). The driver's
    multiprocessing folder (/tmp/pymp-*, the fork server's socket), which only the driver's exit removes, goes too, and
    so does what the group's ranks registered (``labkit.runtime.rank_files``)."""
    while pid_alive(driver_pid):
        time.sleep(DRIVER_POLL_S)
    own_tempdir = mp_process.current_process()._config.get("tempdir")  # made by this rank; os._exit skips its cleanup
    for folder in (driver_tempdir, own_tempdir):
        if folder and os.path.basename(folder).startswith("pymp-"):
            shutil.rmtree(folder, ignore_errors=True)
    rank_files.sweep(rank_files.group_dir())  # what the group's ranks made outside their processes
    os._exit(70)
