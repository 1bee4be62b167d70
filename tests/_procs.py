"""Process helpers for the tests that check what a run leaves behind or listens on (read from /proc)."""

from __future__ import annotations

import os
import tempfile
import threading


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


class _ShmWatch(threading.Thread):
    """The /dev/shm entries this test process's tree maps or holds open, sampled every ``PERIOD_S`` while a leftovers
    check runs: a /dev/shm entry is this test's only if one of its processes held it (another job's never is)."""

    PERIOD_S = 0.2

    def __init__(self) -> None:
        super().__init__(daemon=True, name="shm-watch")
        self.seen: set[str] = set()
        self.done = threading.Event()

    def sample(self) -> None:
        for pid in descendants(os.getpid()):
            self.seen |= _shm_held(pid)

    def run(self) -> None:
        while not self.done.wait(self.PERIOD_S):
            self.sample()


_WATCH: _ShmWatch | None = None


def _shm_held(pid: int) -> set[str]:
    """The /dev/shm entries ``pid`` maps or has open."""
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        with open(f"/proc/{pid}/maps") as f:
            links += [line.split(None, 5)[-1].strip() for line in f if "/dev/shm/" in line]
    except OSError:
        return set()
    return {link[len("/dev/shm/") :].split(" ", 1)[0] for link in links if link.startswith("/dev/shm/")}


def run_leftovers() -> dict[str, set]:
    """What a run can leave behind: processes below this one, /dev/shm entries, torch's and multiprocessing's temp
    folders (in this test process's own temp folder), and this process's open sockets. Entries another job on the
    machine holds are not counted. Starts watching which /dev/shm entries this test's processes hold
    (``new_leftovers`` counts only those)."""
    global _WATCH
    if _WATCH is None:
        _WATCH = _ShmWatch()
        _WATCH.sample()
        _WATCH.start()
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
    this test: its own processes and sockets, the /dev/shm entries one of its processes held during the run (sampled
    every ``_ShmWatch.PERIOD_S``) and no other live process holds, and the entries of its own temp folder."""
    import time

    global _WATCH
    deadline = time.monotonic() + wait_s
    while True:
        now = run_leftovers()
        _WATCH.sample()
        now["dev_shm"] &= _WATCH.seen  # held by this test's processes at some point of the run, never another job's
        left = {k: now[k] - before[k] - (ignore or {}).get(k, set()) for k in now}
        left = {k: v for k, v in left.items() if v}
        if not left or time.monotonic() > deadline:
            _WATCH.done.set()
            _WATCH = None
            return {k: {cmdline(p) or p for p in v} if k == "processes" else v for k, v in left.items()}
        time.sleep(0.2)
