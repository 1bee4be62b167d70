"""How labkit imports Ray and calls ray.init: quietly (usage stats, dashboard and log-to-driver noise off), on 127.0.0.1
only, trimmed to what a local worker group uses, and past two start-up hazards of this machine.

Ray's raylet gives its dashboard agent a hard-coded 15 s to start (ray-project/ray#65983): a failed start is reaped
and retried once. `import ray` pulls jsonschema, which imports rfc3987_syntax when installed (it builds 38 lark
parsers: ~3 s CPU per Ray process): processes labkit starts skip that optional module (set
LABKIT_RAY_KEEP_RFC3987=1 to keep it). A Ray labkit starts itself is also trimmed (`_lean_head`): about 40% less
start-up time on 2 cores.

A Ray labkit starts listens on 127.0.0.1 only (`LOOPBACK_ENV`): Ray binds its gRPC servers to loopback when the node's
address is 127.0.0.1, which ray.init picks on Linux only with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0. A cluster joined
through RAY_ADDRESS listens as it was started; labkit says so when it joins one. Who holds the connection and when it
is shut down is ``labkit.runtime.ray_launcher``'s."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from labkit.runtime.ray_reaper import session_pids

QUIET_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
# raylet settings for a Ray labkit starts: no idle Python workers prestarted at start-up (actors get workers of their
# own anyway; each idle one imports Ray for ~1 CPU-s while the ranks start)
LEAN_ENV = {"RAY_prestart_worker_first_driver": "0", "RAY_num_prestart_python_workers": "0"}  # see _lean_head
# a Ray labkit starts takes 127.0.0.1 as its node address (ray._private.services.get_node_ip_address), so gcs_server,
# raylet, the agents and every worker bind to loopback (ray/rpc/grpc_server.cc: listen_to_localhost_only)
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
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


def connect(ray: Any, num_cpus: int) -> None:
    """ray.init: join RAY_ADDRESS, or start a quiet, lean, loopback-only local Ray (one retry of a start that timed out)."""
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
