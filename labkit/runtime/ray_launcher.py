"""Ray launcher: start Ray quietly (or join RAY_ADDRESS), one actor per rank, and take both down again.

Ray starts with its usage stats, dashboard and log-to-driver noise off. Two start-up hazards of this machine are handled here: Ray's raylet gives
its dashboard agent a hard-coded 15 s to start (ray-project/ray#65983), and `import ray` pulls jsonschema, which
imports rfc3987_syntax when installed (it builds 38 lark parsers: ~3 s CPU per Ray process). Processes labkit starts
skip that optional module (set LABKIT_RAY_KEEP_RFC3987=1 to keep it); a failed start is reaped and retried once.
A Ray labkit starts itself is also trimmed to what a local worker group uses (`_lean_head`): about 40% less
start-up time on 2 cores.

A Ray labkit starts listens on 127.0.0.1 only (`LOOPBACK_ENV`): Ray binds its gRPC servers to loopback when the node's
address is 127.0.0.1, which ray.init picks on Linux only with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0. A cluster joined
through RAY_ADDRESS listens as it was started; labkit says so when it joins one."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from labkit.runtime import ray_reaper
from labkit.runtime.rank_host import RankHost, not_ready_envelope
from labkit.runtime.ray_reaper import session_pids

QUIET_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
# raylet settings for a Ray labkit starts: no idle Python workers prestarted at start-up (actors get workers of their
# own anyway; each idle one imports Ray for ~1 CPU-s while the ranks start)
LEAN_ENV = {"RAY_prestart_worker_first_driver": "0", "RAY_num_prestart_python_workers": "0"}  # see _lean_head
# a Ray labkit starts takes 127.0.0.1 as its node address (ray._private.services.get_node_ip_address), so gcs_server,
# raylet, the agents and every worker bind to loopback (ray/rpc/grpc_server.cc: listen_to_localhost_only)
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
_RAY_HOST: Any = None
_LABKIT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ray_available() -> bool:
    """True when the `ray` package can be imported here."""
    return importlib.util.find_spec("ray") is not None


def _lean() -> bool:
    """Whether a Ray labkit starts is trimmed (see `_lean_head`); LABKIT_RAY_LEAN=0 starts a full one."""
    return os.environ.get("LABKIT_RAY_LEAN", "1") != "0"


def _skip_rfc3987() -> bool:
    return os.environ.get("LABKIT_RAY_KEEP_RFC3987", "0") != "1"


@contextmanager
def without_rfc3987() -> Iterator[None]:
    """Imports inside skip the optional rfc3987_syntax module (~2 s of lark parsers that ray's and vLLM's jsonschema
    pull in; jsonschema treats it as optional). LABKIT_RAY_KEEP_RFC3987=1 keeps it."""
    guard = _skip_rfc3987() and "rfc3987_syntax" not in sys.modules
    if guard:
        sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        yield
    finally:
        if guard and sys.modules.get("rfc3987_syntax", 0) is None:
            del sys.modules["rfc3987_syntax"]


def _shim_dir() -> str:
    """A folder whose rfc3987_syntax.py raises ImportError (jsonschema treats the module as optional)."""
    path = os.path.join(tempfile.gettempdir(), f"labkit-ray-shim-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "rfc3987_syntax.py")
    if not os.path.exists(target):
        with open(target + ".tmp", "w") as f:
            f.write('raise ImportError("skipped by labkit: its import builds 38 lark parsers (~3 s CPU)")\n')
        os.replace(target + ".tmp", target)
    return path


def import_ray() -> Any:
    """`import ray` with the quiet env vars set (and, by default, without the slow optional rfc3987_syntax)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if "ray" in sys.modules:
        return sys.modules["ray"]
    with without_rfc3987():
        import ray
    return ray


def _reap_failed_start(t_start: float) -> None:
    """Kill what a failed ray.init of this driver left (agents orphaned when the raylet aborted)."""
    root = os.path.join(tempfile.gettempdir(), "ray")
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith("session_2") and f"_{os.getpid()}" in name and os.path.getmtime(path) >= t_start - 1:
            for pid in session_pids(path, exclude=(os.getpid(),)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


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
    _connect(ray, num_cpus)
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


def _connect(ray: Any, num_cpus: int) -> None:
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    address = os.environ.get("RAY_ADDRESS")
    if address:
        print(
            f"labkit: joining the Ray cluster at RAY_ADDRESS={address}; it listens on the addresses it was started "
            "with (a Ray labkit starts itself listens on 127.0.0.1 only)",
            file=sys.stderr,
        )
        host = address.removeprefix("ray://").rsplit(":", 1)[0]
        with _loopback_node(ray, enabled=host in ("127.0.0.1", "localhost")):  # a head started on loopback
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        return
    paths = ([_shim_dir()] if _skip_rfc3987() else []) + [_LABKIT_ROOT]
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", *LEAN_ENV)}
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
    if _lean():
        os.environ.update({k: v for k, v in LEAN_ENV.items() if saved[k] is None})
    try:
        for attempt in range(2):
            t0 = time.time()
            try:
                with _lean_head(), _loopback_node(ray):
                    ray.init(num_cpus=num_cpus, object_store_memory=256 * 2**20, **quiet)
                return
            except Exception as exc:  # Ray raises a bare Exception when the raylet dies during start-up
                if attempt == 1 or "timed out during startup" not in str(exc):
                    raise
                ray.shutdown()
                _reap_failed_start(t0)
    finally:
        _restore_env(saved)


def _restore_env(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextmanager
def _loopback_node(ray: Any, enabled: bool = True) -> Iterator[None]:
    """While ray.init runs, this node's address is 127.0.0.1 (`LOOPBACK_ENV` for the processes it starts; the flag
    `get_node_ip_address` reads, already read from the environment if ray was imported before, for the driver)."""
    if not enabled:
        yield
        return
    constants = ray._private.ray_constants
    saved, flag = {key: os.environ.get(key) for key in LOOPBACK_ENV}, constants.ENABLE_RAY_CLUSTER
    os.environ.update(LOOPBACK_ENV)
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = flag
        _restore_env(saved)


@contextmanager
def _lean_head() -> Iterator[None]:
    """ray.init's head node without the autoscaler monitor, the log monitor and the dashboard's API server.

    A local Ray has nothing to autoscale, labkit passes log_to_driver=False and include_dashboard=False, yet the two
    monitors cost ~1.2 CPU-s each at start-up and ray.init waits ~2.5 s for the API server (which serves the state
    API and job submission, which labkit does not use). ray.init has no flags for these (`ray start --no-monitor`
    has one), so labkit adjusts RayParams and Node while it starts Ray; unchanged where this Ray version differs, or
    when LABKIT_RAY_LEAN=0 (a full Ray, e.g. to use `ray.util.state`)."""
    try:
        from ray._private import node, parameter
    except ImportError:
        yield
        return
    if not _lean() or not hasattr(node.Node, "start_api_server"):
        yield
        return
    original_params, original_api = parameter.RayParams.__init__, node.Node.start_api_server

    def lean_params(self: Any, *args: Any, **kwargs: Any) -> None:
        original_params(self, *args, **kwargs)
        if hasattr(self, "no_monitor") and hasattr(self, "include_log_monitor"):
            self.no_monitor, self.include_log_monitor = True, False

    def no_api_server(self: Any, *, include_dashboard: Any = None, **kwargs: Any) -> None:
        if include_dashboard:
            original_api(self, include_dashboard=include_dashboard, **kwargs)
        else:
            self._webui_url = None

    parameter.RayParams.__init__, node.Node.start_api_server = lean_params, no_api_server
    try:
        yield
    finally:
        parameter.RayParams.__init__, node.Node.start_api_server = original_params, original_api


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
