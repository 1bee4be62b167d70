"""WorkerGroup: verl's single controller over real processes (Ray actors, or spawned processes without Ray).

A call of a registered method dispatches the arguments, runs on the ranks, waits under the driver's watchdog
(``call_watchdog``), records what every rank saw into a live StepTrace (``live_call``) and collects. Holds the group's
start-up (launcher, backend, rank hosts), its calls and its shutdown. Mirrors verl/single_controller/ray/base.py:
RayWorkerGroup and func_generator."""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from labkit.runtime import process_group, rank_files
from labkit.runtime.call_watchdog import CallWatchdog
from labkit.runtime.dispatch import first_batch_arg, resolve, rows_tokens, split_for_ranks, unpad_output
from labkit.runtime.group_start import check_group_args, check_importable, rank_host_kwargs
from labkit.runtime.live_call import BoundMethod, LiveFuture, record_call
from labkit.runtime.local_launcher import LocalLauncher
from labkit.runtime.processes import pid_alive, wait_gone
from labkit.runtime.rank_errors import (
    CallTimeoutError,
    CollectiveTimeoutError,
    RankDiedError,
    RankError,
    RankUnresponsiveError,
    WorkerGroupError,
    root_cause,
)
from labkit.runtime.rank_host import CALL_QUERY
from labkit.runtime.worker import Execute, registered_methods
from labkit.trace import StepTrace

CLOSE_GRACE_S = 6.0
"""Seconds every rank has to destroy its process group and engine and say so before close() kills it: a vLLM rank
on a loaded 2-core machine needs more than 3 s. Ranks that reply end the wait at once."""

GRACE_S = 2.0  # the driver's watchdog fires this long after a collective's own timeout
_LIVE: weakref.WeakSet[WorkerGroup] = weakref.WeakSet()
__all__ = [
    "WorkerGroup",
    "live_groups",
    "WorkerGroupError",
    "RankError",
    "CollectiveTimeoutError",
    "RankDiedError",
    "RankUnresponsiveError",
    "CallTimeoutError",
    "GRACE_S",
]


def live_groups() -> list[WorkerGroup]:
    """Worker groups created and not yet closed in this process."""
    return [wg for wg in list(_LIVE) if not wg.closed]


@atexit.register
def _close_at_exit() -> None:
    """A driver that exits with groups open (a script, a notebook kernel) still closes them: ranks, and what they made
    outside their processes (``rank_files``)."""
    for wg in live_groups():
        try:
            wg.close()
        except Exception:  # noqa: BLE001 - the interpreter is going: close what can be closed
            pass


class WorkerGroup:
    """W ranks of `worker_cls` as Ray actors (default) or local processes; a context manager that always cleans up.

    launcher "auto" picks Ray when importable; init_kwargs go to every rank's constructor (worker_cls.check_world
    sees them first, on the driver); timeout_s bounds a call, collective_timeout_s every labkit.runtime.dist collective;
    env is set in each rank before its process group starts. Registered methods become attributes: wg.compute(data)."""

    def __init__(
        self,
        worker_cls: type,
        world_size: int,
        *,
        launcher: str = "auto",
        init_kwargs: dict | None = None,
        timeout_s: float = 120.0,
        collective_timeout_s: float = process_group.DEFAULT_COLLECTIVE_TIMEOUT_S,
        start_timeout_s: float = 180.0,
        env: dict[str, str] | None = None,
        backend: str = "auto",
        profile: str = "engine",
        actor_options: dict | None = None,
        num_cpus: int | None = None,
        start_method: str | None = None,
    ) -> None:
        timeouts = dict(timeout_s=timeout_s, collective_timeout_s=collective_timeout_s, start_timeout_s=start_timeout_s)
        init_kwargs = check_group_args(worker_cls, world_size, init_kwargs, timeouts)
        self.worker_cls, self.world_size = worker_cls, world_size
        self.timeout_s, self.collective_timeout_s = timeout_s, collective_timeout_s
        self.trace = StepTrace(profile=profile, source="live")
        self.closed, self.teardown, self.pids, self.swept = False, [], [None] * world_size, []
        self._owns_ray, self._launcher, self._broken, self._stage = False, None, None, None
        self._dispatch_info: dict[str, list[int]] = {}
        self._collect_info: dict[str, list[bool]] = {}
        self._methods = registered_methods(worker_cls)
        for name in self._methods:
            if hasattr(WorkerGroup, name):
                raise ValueError(f"worker method {name!r} clashes with WorkerGroup.{name}; rename it")
        self.launcher = _pick_launcher(launcher)
        if self.launcher == "local":
            check_importable(worker_cls)
        backend, device_kind = process_group.choose_backend(world_size, backend)
        self.backend, self.device_kind = backend, device_kind
        self.group_dir = rank_files.new_group_dir()  # what ranks make outside their process is listed here
        env = {**(env or {}), rank_files.ENV: self.group_dir}
        host_kwargs = rank_host_kwargs(
            worker_cls, world_size, init_kwargs, env, backend, device_kind, collective_timeout_s, start_timeout_s
        )
        _LIVE.add(self)
        try:
            if self.launcher == "ray":
                from labkit.runtime.ray_launcher import RayLauncher, start_ray

                self._owns_ray = start_ray(num_cpus or max(4, world_size))
                self._launcher = RayLauncher(world_size, host_kwargs, actor_options)
            else:
                self._launcher = LocalLauncher(world_size, host_kwargs, start_method)
            ready = self._launcher.wait_ready(start_timeout_s)
            self.pids = list(self._launcher.pids)
            errors = [ready[r] for r in range(world_size) if not ready[r]["ok"]]
            if errors:
                raise root_cause(errors)
        except BaseException:
            self.close()
            raise
        for name, spec in self._methods.items():
            setattr(self, name, BoundMethod(self, name, spec))

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            try:
                self.close()
            except Exception:
                pass

    def close(self) -> list[dict]:
        """Destroy every rank's process group, kill every actor/process, stop Ray if this group started it."""
        if self.closed:
            return self.teardown
        self.closed = True
        try:
            if self._launcher is not None:
                self.teardown = self._launcher.close(graceful_s=CLOSE_GRACE_S)
                wait_gone([p for p in self._launcher.pids if p], 10.0)
        finally:
            self.swept = rank_files.sweep(getattr(self, "group_dir", None))
            if self._owns_ray:
                from labkit.runtime.ray_launcher import stop_ray

                stop_ray()
                self._owns_ray = False
        return self.teardown

    def alive_pids(self) -> list[int]:
        """PIDs of this group's rank processes that still exist (zombies count as gone)."""
        return [p for p in self.pids if p and pid_alive(p)]

    # ---- dispatch info (cached per mesh, as verl) ---------------------------------------------------------------
    def dispatch_info(self, mesh_name: str) -> list[int]:
        """Each rank's registered dp_rank for a mesh. Mirrors RayWorkerGroup._query_dispatch_info (cached)."""
        if mesh_name not in self._dispatch_info:
            self._dispatch_info[mesh_name] = self._query(mesh_name, "dp_rank")
        return self._dispatch_info[mesh_name]

    def collect_info(self, mesh_name: str) -> list[bool]:
        """Each rank's registered is_collect for a mesh (cached)."""
        if mesh_name not in self._collect_info:
            self._collect_info[mesh_name] = self._query(mesh_name, "is_collect")
        return self._collect_info[mesh_name]

    def dp_size(self, mesh_name: str) -> int:
        """DP size of a mesh = max registered dp_rank + 1 (what _balance_batch uses: RayPPOTrainer._get_dp_size)."""
        return max(self.dispatch_info(mesh_name)) + 1

    def _query(self, mesh_name: str, key: str) -> list:
        self._check_usable()
        ranks = list(range(self.world_size))
        handle = self._launcher.submit(
            ranks, CALL_QUERY, [(mesh_name, key)] * self.world_size, [{}] * self.world_size, {}
        )
        results = self._await(handle, ranks, CALL_QUERY)
        errors = [results[r] for r in ranks if not results[r]["ok"]]
        if errors:
            raise root_cause(errors)
        return [results[r]["value"] for r in ranks]

    # ---- calls --------------------------------------------------------------------------------------------------
    @contextmanager
    def stage(self, label: str) -> Iterator[None]:
        """Calls inside the block record their trace under `label` instead of the method name."""
        previous, self._stage = self._stage, label
        try:
            yield
        finally:
            self._stage = previous

    def reset_trace(self) -> StepTrace:
        """Start a fresh live trace; returns the previous one."""
        old, self.trace = self.trace, StepTrace(profile=self.trace.profile, source="live")
        return old

    def call(self, method: str, *args: Any, _stage: str | None = None, **kwargs: Any) -> Any:
        """Run a registered method by name: dispatch, execute, (wait, record, collect unless blocking=False)."""
        if method not in self._methods:
            raise AttributeError(
                f"{self.worker_cls.__name__}.{method} is not a registered method (registered: {sorted(self._methods)})"
            )
        spec = self._methods[method]
        self._check_usable()
        if spec.materialize_futures:
            args = tuple(a.get() if isinstance(a, LiveFuture) else a for a in args)
            kwargs = {k: v.get() if isinstance(v, LiveFuture) else v for k, v in kwargs.items()}
        dispatch_fn, collect_fn, mesh_name = resolve(spec)
        global_rows, _ = rows_tokens(first_batch_arg(args, kwargs))
        split_args, split_kwargs, pad = dispatch_fn(self, *args, **kwargs)
        if spec.execute_mode is Execute.RANK_ZERO:
            ranks, per_args, per_kwargs = [0], [tuple(split_args)], [dict(split_kwargs)]
        else:
            ranks = list(range(self.world_size))
            per_args, per_kwargs = split_for_ranks(self.world_size, tuple(split_args), dict(split_kwargs))
        opts = {"gather_group": spec.all_gather_group, "mesh_name": mesh_name}
        handle = self._launcher.submit(ranks, method, per_args, per_kwargs, opts)
        future = LiveFuture(
            self, handle, ranks, method, spec, collect_fn, pad, _stage or self._stage or method, global_rows
        )
        return future.get() if spec.blocking else future

    def _finish(self, fut: LiveFuture) -> Any:
        results = self._await(fut.handle, fut.ranks, fut.method, fut.stage)
        errors = [results[r] for r in fut.ranks if not results[r]["ok"]]
        if errors:
            raise root_cause(errors, fut.stage)
        outputs = [results[r]["value"] for r in fut.ranks]
        record_call(self, fut, [results[r]["record"] for r in fut.ranks])
        if fut.spec.execute_mode is Execute.RANK_ZERO:
            return outputs[0]
        return unpad_output(fut.collect_fn(self, outputs), fut.pad)

    def _await(self, handle: Any, ranks: list[int], method: str, stage: str | None = None) -> dict[int, dict]:
        """Wait for every rank under the driver's watchdog (``call_watchdog``); a fault it names (a rank hung in a
        collective, dead, or silent) makes the group unusable."""
        watchdog = CallWatchdog(self._launcher, self.pids, self.timeout_s, self.collective_timeout_s, GRACE_S)
        try:
            return watchdog.wait(handle, ranks, method, stage)
        finally:
            self._broken = watchdog.broken or self._broken

    def _check_usable(self) -> None:
        if self.closed:
            raise WorkerGroupError("worker group is closed")
        if self._broken:
            raise WorkerGroupError(f"worker group is unusable ({self._broken}); close it and start a new one")


def _pick_launcher(launcher: str) -> str:
    from labkit.runtime.ray_init import ray_available

    if launcher == "auto":
        return "ray" if ray_available() else "local"
    if launcher not in ("ray", "local"):
        raise ValueError(f"launcher must be 'ray', 'local' or 'auto', got {launcher!r}")
    if launcher == "ray" and not ray_available():
        raise ImportError("launcher='ray' but Ray is not installed here; use launcher='local' (or 'auto')")
    return launcher
