"""Process helpers for the tests that check what a run leaves behind or listens on (read from /proc)."""

from __future__ import annotations

import os
import tempfile


def _children() -> dict[int, list[int]]:
    """Every live process's children, by parent pid."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it."""
    children = _children()
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo.extend(children.get(p, []))
    return found


def spawned_processes() -> set[int]:
    """Live processes below this one, except multiprocessing's own helpers (the fork server, the resource tracker),
    which serve the whole test process; ranks forked by the fork server are below it, so they do count."""
    from labkit.runtime.processes import pid_alive

    me = os.getpid()
    helpers = {p for p in _children().get(me, []) if "forkserver" in cmdline(p) or "resource_tracker" in cmdline(p)}
    return {p for p in descendants(me) - {me} - helpers if pid_alive(p)}


def cmdline(pid: int) -> str:
    """The command line of ``pid`` ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _foreign_holds(ours: set[int]) -> set[str]:
    """/dev/shm names and temp-folder entries that a live process outside ``ours`` holds (maps, has open, works in,
    or listens in): another job's on this shared machine, never this test's leftovers."""
    held: set[str] = set()
    inodes: dict[str, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        pid = int(entry)
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            links.append(os.readlink(f"/proc/{pid}/cwd"))
            with open(f"/proc/{pid}/maps") as f:
                links += [line.split(None, 5)[-1].strip() for line in f if "/dev/shm/" in line or _tmp() in line]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:["):
                inodes[link[8:-1]] = pid
            elif pid not in ours:
                held |= _named(link)
    with open("/proc/net/unix") as f:  # a listener's path: held by the process that owns its socket
        for line in f.readlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and inodes.get(fields[6], -1) not in ours | {-1}:
                held |= _named(fields[7])
    return held


def _tmp() -> str:
    """This test process's temp folder (tests/conftest.py gives each its own), with a trailing slash."""
    return tempfile.gettempdir().rstrip("/") + "/"


def _named(path: str) -> set[str]:
    for root in ("/dev/shm/", _tmp()):
        if path.startswith(root):
            return {root + path[len(root) :].split("/", 1)[0]}
    return set()


def run_leftovers() -> dict[str, set]:
    """What a run can leave behind: processes below this one, /dev/shm entries, torch's and multiprocessing's temp
    folders (in this test process's own temp folder), and this process's open sockets. Entries another job on the machine holds are not counted."""
    ours = descendants(os.getpid())
    foreign = _foreign_holds(ours)
    tmp = {e for e in os.listdir(_tmp()) if e.startswith(("torchelastic_", "pymp-")) and _tmp() + e not in foreign}
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            sockets.add(target)
    return {
        "processes": ours - {os.getpid()},
        "dev_shm": {n for n in shm if f"/dev/shm/{n}" not in foreign},
        "tmp": tmp,
        "sockets": sockets,
    }


def new_leftovers(before: dict[str, set], wait_s: float = 10.0, ignore: dict[str, set] | None = None) -> dict:
    """What appeared since ``before`` and is still there after up to ``wait_s`` (empty dict: nothing). Scoped to
    this test: its own processes and sockets, and the /dev/shm and /tmp entries no other live process holds."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        now = run_leftovers()
        left = {k: now[k] - before[k] - (ignore or {}).get(k, set()) for k in now}
        left = {k: v for k, v in left.items() if v}
        if not left or time.monotonic() > deadline:
            return {k: {cmdline(p) or p for p in v} if k == "processes" else v for k, v in left.items()}
        time.sleep(0.2)
