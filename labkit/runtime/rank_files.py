"""Files a rank makes outside its own process (shared-memory segments, sockets), swept by the driver once the group is
gone, also when a rank raised, was killed, or died mid-call.

The driver gives every group a folder (``LABKIT_GROUP_DIR``); a rank appends what it makes to a list in it before
or right after making it, so even a SIGKILLed rank leaves a record. ``sweep`` removes the listed entries and the folder.
Only entries in /dev/shm or inside the group's folder are ever removed (a list is never trusted beyond that)."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

ENV = "LABKIT_GROUP_DIR"
PREFIX = "labkit-group-"
_ALLOWED = ("/dev/shm/",)


def new_group_dir() -> str:
    """A fresh folder for one worker group (driver side), after sweeping the folders of drivers that are gone."""
    sweep_abandoned()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")


def _driver_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_abandoned() -> list[str]:
    """The folders (and what their ranks registered) of drivers that exited without closing their groups (killed,
    ``os._exit``): a folder is abandoned when the pid in its name is gone. Another live driver's are left alone."""
    removed = []
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*")):
        pid = os.path.basename(folder)[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _driver_alive(int(pid)):
            removed += sweep(folder)
            removed.append(folder)
    return removed


def group_dir() -> str | None:
    """This rank's group folder (None outside a labkit group)."""
    path = os.environ.get(ENV)
    return path if path and os.path.isdir(path) else None


def register(*patterns: str) -> None:
    """Record paths or glob patterns this rank makes (e.g. /dev/shm/<name>*), for ``sweep``; no-op outside a group."""
    folder = group_dir()
    if folder is None:
        return
    with open(os.path.join(folder, f"files-{os.getpid()}.txt"), "a") as f:
        f.write("".join(p + "\n" for p in patterns))
        f.flush()
        os.fsync(f.fileno())


def _allowed(path: str, folder: str) -> bool:
    real = os.path.realpath(path)
    return real.startswith(_ALLOWED) or real.startswith(os.path.realpath(folder) + os.sep)


def _remove(path: str) -> bool:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def remove_registered(folder: str | None = None, own_only: bool = False) -> list[str]:
    """Remove what the group's ranks registered (``own_only``: this process's list only); the removed paths."""
    folder = folder or group_dir()
    if not folder or not os.path.isdir(folder):
        return []
    lists = [f"files-{os.getpid()}.txt"] if own_only else [n for n in os.listdir(folder) if n.startswith("files-")]
    removed = []
    for name in lists:
        try:
            with open(os.path.join(folder, name)) as f:
                patterns = [line.strip() for line in f if line.strip()]
        except OSError:
            continue
        for pattern in patterns:
            for path in glob.glob(pattern, recursive=False):
                if _allowed(path, folder) and _remove(path):
                    removed.append(path)
    return removed


def sweep(folder: str | None) -> list[str]:
    """Driver side, once no rank of the group is alive: remove every registered entry, then the folder itself."""
    if not folder or not os.path.basename(folder).startswith(PREFIX):
        return []
    removed = remove_registered(folder)
    shutil.rmtree(folder, ignore_errors=True)
    return removed
