"""The Ray side of a worker group: the Ray connection labkit holds (started quietly by ``labkit.runtime.ray_init``,
shared by worker groups, shut down by its last holder, its session folder removed and a reaper for a killed driver)
and one actor per rank, each hosting the rank's RankHost."""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import Any

from labkit.runtime import ray_reaper
from labkit.runtime.rank_host import RankHost, not_ready_envelope
from labkit.runtime.ray_init import connect, import_ray

_RAY_HOST: Any = None
_HOLDERS = 0  # worker groups / hold_ray callers sharing the Ray connection labkit made (0: labkit made none)
_SESSION_DIR: str | None = None  # the session folder of the local Ray labkit started (removed when it stops)
_REAPER: Any = None  # the process that takes that Ray down if this driver is killed (labkit.runtime.ray_reaper)


def start_ray(num_cpus: int) -> bool:
    """Start a quiet local Ray (or join RAY_ADDRESS) unless one is connected; True when the caller holds a share of
    a connection labkit made (then it must call stop_ray once). A Ray the user started is never held, and the
    connection labkit made is shut down only when its last holder stops: two worker groups may share it."""
    global _HOLDERS, _SESSION_DIR, _REAPER
    ray = import_ray()
    if ray.is_initialized():
        if _HOLDERS > 0:
            _HOLDERS += 1
            return True
        return False
    _HOLDERS = 0  # a labkit-made connection shut down behind labkit's back leaves no holders
    connect(ray, num_cpus)
    _HOLDERS = 1
    _SESSION_DIR = None if os.environ.get("RAY_ADDRESS") else _session_dir(ray)
    if _SESSION_DIR:
        _REAPER = ray_reaper.start(_SESSION_DIR)
    return True


def _session_dir(ray: Any) -> str | None:
    """The local Ray session's folder (logs, sockets: tens of MB), to remove once that Ray is shut down."""
    try:
        return str(ray._private.worker._global_node.get_session_dir_path())
    except Exception:  # noqa: BLE001 - a private Ray API: without it the folder stays
        return None


def stop_ray() -> None:
    """Give back one share of the Ray connection labkit made (start_ray returned True); the last one shuts it down."""
    global _HOLDERS, _SESSION_DIR, _REAPER
    _HOLDERS = max(0, _HOLDERS - 1)
    if _HOLDERS == 0:
        ray = import_ray()
        if ray.is_initialized():
            ray.shutdown()
        if _SESSION_DIR and os.path.basename(_SESSION_DIR).startswith("session_"):  # the Ray labkit started locally
            shutil.rmtree(_SESSION_DIR, ignore_errors=True)
        _SESSION_DIR = None
        if _REAPER is not None:
            _REAPER.kill()
            _REAPER.wait()
            _REAPER = None


def _host_class() -> Any:
    """RankHost as a Ray actor class; status() runs in its own concurrency group so it answers during a call."""
    global _RAY_HOST
    if _RAY_HOST is None:
        ray = import_ray()

        class RayRankHost(RankHost):
            @ray.method(concurrency_group="status")
            def status(self) -> dict[str, Any]:
                return RankHost.status(self)

        _RAY_HOST = ray.remote(concurrency_groups={"status": 1})(RayRankHost)
    return _RAY_HOST


def _died(rank: int, method: str, exc: BaseException) -> dict[str, Any]:
    """A dead actor's envelope: its pid and Ray's exit type and detail in one line, Ray's whole text as traceback."""
    text = str(exc)
    pid = re.search(r"^\s*pid: (\d+)", text, re.M)
    exit_type = re.search(r"Worker exit type: (\S+)", text)
    detail = re.search(r"Worker exit detail: (.*?\.)(?: |$)", text)
    if exit_type:
        how = f"its process exited (Ray: {exit_type.group(1)}{': ' + detail.group(1) if detail else ''})"
        if exit_type.group(1) == "SYSTEM_ERROR":
            how += "; killed by a signal (SIGKILL, the OOM killer) or crashed"
    else:
        how = f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"
    return {
        "ok": False,
        "rank": rank,
        "method": method,
        "exc_type": "RankDied",
        "died": True,
        "message": f"rank {rank}{f' (pid {pid.group(1)})' if pid else ''} actor died: {how}",
        "traceback": text,
    }


class RayLauncher:
    """One Ray actor per rank; same interface as launcher.LocalLauncher."""

    name = "ray"

    def __init__(self, world_size: int, host_kwargs: list[dict], actor_options: dict | None = None) -> None:
        self.ray = import_ray()
        self.world_size = world_size
        options = {"num_cpus": 0, "max_restarts": 0, **(actor_options or {})}
        self.actors = [_host_class().options(**options).remote(**host_kwargs[r]) for r in range(world_size)]
        self.pids: list[int | None] = [None] * world_size

    def _gather(self, refs: dict[int, Any], timeout: float, method: str) -> dict[int, dict]:
        out: dict[int, dict] = {}
        if not refs:
            return out
        ready, _ = self.ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        ready_set = set(ready)
        for rank, ref in refs.items():
            if ref in ready_set:
                try:
                    out[rank] = self.ray.get(ref)
                except Exception as exc:  # RayActorError: the process is gone
                    out[rank] = _died(rank, method, exc)
        return out

    def wait_ready(self, timeout_s: float) -> dict[int, dict]:
        refs = {r: a.ready.remote() for r, a in enumerate(self.actors)}
        out: dict[int, dict] = {}
        start = time.monotonic()
        deadline = start + timeout_s
        while len(out) < self.world_size and time.monotonic() < deadline:
            out.update(self._gather({r: f for r, f in refs.items() if r not in out}, 0.2, "__init__"))
            if any(not e["ok"] for e in out.values()):
                break  # a rank failed to start: its peers may wait for it forever; the driver closes them all
        for rank in range(self.world_size):
            out.setdefault(rank, not_ready_envelope(rank, time.monotonic() - start, timeout_s))
            self.pids[rank] = out[rank].get("pid")
        return out

    def _gone(self) -> bool:
        """True when Ray was shut down under this group (its actors died with it). A `.remote()` call would then
        silently start a new local Ray (ray auto-init) and fail there."""
        return not self.ray.is_initialized()

    def _gone_envelopes(self, ranks: Any, method: str) -> dict[int, dict]:
        exc = RuntimeError(
            "Ray was shut down while this worker group was open (ray.shutdown() or the Ray session "
            "ended); its actors are gone"
        )
        return {r: _died(r, method, exc) for r in ranks}

    def submit(
        self, ranks: list[int], method: str, per_rank_args: list[tuple], per_rank_kwargs: list[dict], opts: dict
    ) -> dict[str, Any]:
        if self._gone():
            return {"refs": {}, "done": self._gone_envelopes(ranks, method), "method": method}
        refs = {r: self.actors[r].call.remote(method, per_rank_args[r], per_rank_kwargs[r], **opts) for r in ranks}
        return {"refs": refs, "done": {}, "method": method}

    def poll(self, handle: dict[str, Any], timeout: float) -> dict[int, dict]:
        pending = {r: ref for r, ref in handle["refs"].items() if r not in handle["done"]}
        if pending and self._gone():
            handle["done"].update(self._gone_envelopes(pending, handle["method"]))
            return dict(handle["done"])
        handle["done"].update(self._gather(pending, timeout, handle["method"]))
        return dict(handle["done"])

    def status(self, ranks: list[int], timeout: float = 1.0) -> dict[int, dict | None]:
        if self._gone():
            return {r: None for r in ranks}
        got = self._gather({r: self.actors[r].status.remote() for r in ranks}, timeout, "status")
        return {r: (got[r] if r in got and "died" not in got[r] else None) for r in ranks}

    def close(self, graceful_s: float = 3.0) -> list[dict]:
        """Ask each rank to destroy its process group (behind any running call), then ray.kill every actor."""
        if self._gone():  # the actors went down with Ray
            return [
                {"rank": r, "pid": self.pids[r], "pg_destroyed": None, "killed": True} for r in range(self.world_size)
            ]
        reports = self._gather({r: a.shutdown.remote() for r, a in enumerate(self.actors)}, graceful_s, "shutdown")
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass
        return [
            reports[r]
            if r in reports and "died" not in reports[r]
            else {"rank": r, "pid": self.pids[r], "pg_destroyed": None, "killed": True}
            for r in range(self.world_size)
        ]
