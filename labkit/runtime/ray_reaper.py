"""The reaper of a Ray labkit starts: a small process that outlives a SIGKILLed driver and takes its Ray down.

Ray's gcs_server and raylet share the driver's fate, but its DashboardAgent and RuntimeEnvAgent linger for minutes
after a SIGKILL (they poll a raylet that is gone). The reaper polls the driver's pid; when the driver is gone it kills
every process of the session folder and removes the folder, then the driver's worker-group folders with what their
ranks registered (``rank_files``). Standard library only: it runs as a plain script."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

POLL_S = 0.5


def session_pids(session_dir: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """PIDs whose command line or open files point into a Ray session folder."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        if int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                hit = session_dir.encode() in f.read()
            if not hit:
                for fd in os.listdir(f"/proc/{entry}/fd"):
                    if os.readlink(f"/proc/{entry}/fd/{fd}").startswith(session_dir):
                        hit = True
                        break
        except OSError:
            continue
        if hit:
            pids.append(int(entry))
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start(session_dir: str) -> subprocess.Popen:
    """Start the reaper of this driver's Ray session (in its own session, so the driver's signals do not reach it)."""
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(os.getpid()), session_dir],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def main(driver_pid: int, session_dir: str) -> None:
    while _alive(driver_pid):
        if not os.path.isdir(session_dir):  # the driver stopped its Ray itself
            return
        time.sleep(POLL_S)
    for pid in session_pids(session_dir, exclude=(os.getpid(),)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(session_dir, ignore_errors=True)
    sweep_groups(driver_pid)


def sweep_groups(driver_pid: int) -> None:
    """The driver's worker-group folders and what its ranks registered in them (``rank_files``: shared memory)."""
    import glob
    import tempfile

    from rank_files import PREFIX, sweep  # a sibling module, standard library only (this runs as a plain script)

    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}{driver_pid}-*")):
        sweep(folder)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
