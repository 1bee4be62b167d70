"""WorkerGroup: verl's single controller over real processes (Ray actors, or spawned processes without Ray).

A call of a registered method dispatches the arguments, runs on the ranks, waits with a watchdog, records what every
rank saw into a live StepTrace and collects. Mirrors verl/single_controller/ray/base.py: RayWorkerGroup and
func_generator."""

from __future__ import annotations

import atexit
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from labkit.runtime import dist, rank_files
from labkit.runtime.dispatch import (
    Dispatch,
    Execute,
    MethodSpec,
    collected_ranks,
    first_batch_arg,
    registered_methods,
    resolve,
    rows_tokens,
    split_for_ranks,
    unpad_output,
)
from labkit.runtime.local_launcher import LocalLauncher, check_importable, pid_alive, process_state, wait_gone
from labkit.runtime.rank_errors import (
    CallTimeoutError,
    CollectiveTimeoutError,
    RankDiedError,
    RankError,
    RankUnresponsiveError,
    WorkerGroupError,
    root_cause,
)
from labkit.runtime.rank_host import CALL_QUERY, format_report
from labkit.trace import RankRecord, StageRecord, StepTrace

CLOSE_GRACE_S = 6.0
"""Seconds every rank has to destroy its process group and engine and say so before close() kills it: a vLLM rank
on a loaded 2-core machine needs more than 3 s. Ranks that reply end the wait at once."""

GRACE_S = 2.0  # the driver's watchdog fires this long after a collective's own timeout
_LIVE: weakref.WeakSet[WorkerGroup] = weakref.WeakSet()
__all__ = [
    "WorkerGroup",
    "LiveFuture",
    "live_groups",
    "WorkerGroupError",
    "RankError",
    "CollectiveTimeoutError",
    "RankDiedError",
    "RankUnresponsiveError",
    "CallTimeoutError",
    "GRACE_S",
]
_DP_MODES = (
    Dispatch.DP_COMPUTE,
    Dispatch.DP_COMPUTE_PROTO,
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
    Dispatch.DP_COMPUTE_METRIC,
)


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


class LiveFuture:
    """A dispatched call not yet collected (register(..., blocking=False)); get() waits, records, collects.

    Plays the role of verl/protocol.py: DataProtoFuture, materialised on the driver."""

    def __init__(
        self,
        wg: WorkerGroup,
        handle: Any,
        ranks: list[int],
        method: str,
        spec: MethodSpec,
        collect_fn: Any,
        pad: int,
        stage: str,
        global_rows: int,
    ) -> None:
        self.wg, self.handle, self.ranks, self.method, self.spec = wg, handle, ranks, method, spec
        self.collect_fn, self.pad, self.stage, self.global_rows = collect_fn, pad, stage, global_rows
        self._done, self._value = False, None

    def get(self) -> Any:
        if not self._done:
            self._value, self._done = self.wg._finish(self), True
        return self._value


class _BoundMethod:
    """`wg.<method>(...)`: dispatch → run on the ranks → collect (the role of verl's func_generator)."""

    def __init__(self, wg: WorkerGroup, name: str, spec: MethodSpec) -> None:
        self._wg, self.__name__, self.spec = weakref.proxy(wg), name, spec

    def __call__(self, *args: Any, _stage: str | None = None, **kwargs: Any) -> Any:
        return self._wg.call(self.__name__, *args, _stage=_stage, **kwargs)

    def __repr__(self) -> str:
        return f"<registered {self.__name__} [{self.spec.mode_name}, {self.spec.execute_mode.value}]>"


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
        collective_timeout_s: float = dist.DEFAULT_COLLECTIVE_TIMEOUT_S,
        start_timeout_s: float = 180.0,
        env: dict[str, str] | None = None,
        backend: str = "auto",
        profile: str = "engine",
        actor_options: dict | None = None,
        num_cpus: int | None = None,
        start_method: str | None = None,
    ) -> None:
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        for key, value in (
            ("timeout_s", timeout_s),
            ("collective_timeout_s", collective_timeout_s),
            ("start_timeout_s", start_timeout_s),
        ):
            dist.check_timeout(key, value)
        init_kwargs = dict(init_kwargs or {})
        worker_cls.check_world(world_size, **init_kwargs) if hasattr(worker_cls, "check_world") else None
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
        backend, device_kind = dist.choose_backend(world_size, backend)
        self.backend, self.device_kind = backend, device_kind
        self.group_dir = rank_files.new_group_dir()  # what ranks make outside their process is listed here
        env = {**(env or {}), rank_files.ENV: self.group_dir}
        port = dist.free_port()
        host_kwargs = [
            dict(
                worker_cls=worker_cls,
                rank=r,
                world_size=world_size,
                master_port=port,
                init_kwargs=init_kwargs,
                env=dict(env or {}),
                backend=backend,
                device_kind=device_kind,
                collective_timeout_s=collective_timeout_s,
                rendezvous_timeout_s=start_timeout_s,
            )
            for r in range(world_size)
        ]
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
            setattr(self, name, _BoundMethod(self, name, spec))

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
        self._record(fut, [results[r]["record"] for r in fut.ranks])
        if fut.spec.execute_mode is Execute.RANK_ZERO:
            return outputs[0]
        return unpad_output(fut.collect_fn(self, outputs), fut.pad)

    def _await(self, handle: Any, ranks: list[int], method: str, stage: str | None = None) -> dict[int, dict]:
        """Wait for every rank; the watchdog names a rank stuck in a collective past its timeout within seconds, a
        rank that died, and one that stopped answering while its peers failed in a collective."""
        t0 = time.monotonic()
        next_watch = t0 + self.collective_timeout_s
        death_seen: float | None = None
        raised_seen: float | None = None  # when a rank first raised a plain exception
        next_stuck = t0
        peers_failed: float | None = None  # when a rank first reported a failed collective
        while True:
            results = self._launcher.poll(handle, 0.1)
            if len(results) == len(ranks):
                break
            now = time.monotonic()
            pending = [r for r in ranks if r not in results]
            failed = [e for e in results.values() if not e["ok"]]
            if death_seen is None and any(e.get("died") for e in failed):
                death_seen = now
            if death_seen is not None and now - death_seen > GRACE_S:
                # a rank died: the call cannot complete; report it now rather than wait for peers that keep computing
                self._broken = "a rank died during a call"
                raise root_cause(failed + [_abandoned(r, method, "a peer died") for r in pending], stage)
            if peers_failed is None and any(e.get("collective") or e.get("pg_error") for e in failed):
                peers_failed = now
            if peers_failed is not None and now - peers_failed > GRACE_S:
                # peers gave up on a collective while these ranks never reported: a stopped rank never will
                silent = self._unresponsive(pending, method, failed)
                if silent:
                    self._broken = f"ranks {[e['rank'] for e in silent]} stopped answering"
                    answering = [r for r in pending if r not in {e["rank"] for e in silent}]
                    raise root_cause(
                        failed + silent + [_abandoned(r, method, "a peer failed") for r in answering], stage
                    )
                peers_failed = now  # the others still answer: they reach the collective and time out on their own
            raised = {e["rank"] for e in failed if not (e.get("collective") or e.get("died") or e.get("pending"))}
            raised_seen = raised_seen or (now if raised else None)
            if raised_seen is not None and now - raised_seen > GRACE_S and now >= next_stuck:
                next_stuck = now + 0.5  # peers of a raised rank that wait with no timeout (dist.waiting_on)
                stuck = [r for r, st in self._launcher.status(pending, timeout=1.0).items()
                         if ((st or {}).get("inflight") or {}).get("unbounded")
                         and raised & set(st["inflight"]["group"])]  # fmt: skip
                if stuck:
                    self._broken = f"ranks {stuck} wait forever on a peer that raised"
                    why = "it waits with no timeout on a peer that raised"
                    raise root_cause(failed + [_abandoned(r, method, why) for r in pending], stage)
            if now >= next_watch:
                next_watch = now + 0.5
                for rank, st in self._launcher.status(pending, timeout=1.0).items():
                    inf = (st or {}).get("inflight")
                    if inf and inf.get("timeout_s") is not None and inf["elapsed_s"] > inf["timeout_s"] + GRACE_S:
                        self._broken = f"rank {rank} hung in {inf['collective']}"
                        env = {
                            "ok": False,
                            "rank": rank,
                            "method": st.get("method"),
                            "exc_type": "CollectiveTimeout",
                            "message": (
                                f"driver watchdog: rank {rank} has waited {inf['elapsed_s']:.1f} s in "
                                f"collective {inf['collective']} over ranks {inf['group']} (timeout "
                                f"{inf['timeout_s']:g} s)"
                            ),
                            "collective": inf,
                            "traceback": format_report(st["report"]) if st.get("report") else "",
                        }
                        raise root_cause([env] + failed, stage)
            if now - t0 > self.timeout_s:
                self._broken = f"ranks {pending} did not answer"
                status = self._launcher.status(pending, timeout=1.0)
                stopped = [r for r in pending if r < len(self.pids) and process_state(self.pids[r] or 0) in ("T", "t")]
                raise CallTimeoutError(
                    f"ranks {pending} did not answer within {self.timeout_s:g} s"
                    + (f" (stopped, state T: ranks {stopped})" if stopped else "")
                    + f"; status: {status}"
                )
        if any(e.get("collective") or e.get("died") for e in results.values()):
            self._broken = "a rank timed out in a collective or died; its process groups are unusable"
        elif any(e.get("pg_error") for e in results.values()):
            self._broken = "a rank raised inside torch.distributed; its process groups may be out of step"
        return results

    def _unresponsive(self, ranks: list[int], method: str, failed: list[dict]) -> list[dict]:
        """Envelopes for the ranks that answer no status query (1 s each) after peers failed in a collective."""
        collectives = sorted({(e.get("collective") or {}).get("collective") or "a collective" for e in failed})
        out = []
        for rank, st in self._launcher.status(ranks, timeout=1.0).items():
            if st is not None:
                continue
            pid = self.pids[rank] if rank < len(self.pids) else None
            state = process_state(pid) if pid else None
            how = "its process is stopped (state T: SIGSTOP or a debugger)" if state in ("T", "t") else (
                "stopped, or blocked without releasing Python's GIL"
            )  # fmt: skip
            out.append(
                {
                    "ok": False,
                    "rank": rank,
                    "method": method,
                    "exc_type": "RankUnresponsive",
                    "unresponsive": True,
                    "pid": pid,
                    "message": (
                        f"rank {rank} (pid {pid}) answered neither its call nor a status query while its peers failed "
                        f"in {', '.join(collectives)}: {how}"
                    ),
                    "traceback": "",
                }
            )
        return out

    def _check_usable(self) -> None:
        if self.closed:
            raise WorkerGroupError("worker group is closed")
        if self._broken:
            raise WorkerGroupError(f"worker group is unusable ({self._broken}); close it and start a new one")

    def _record(self, fut: LiveFuture, records: list[dict]) -> None:
        """Append one RankRecord per executed rank (and the stage) to the live trace."""
        collected = collected_ranks(fut.spec, self)
        per_rank = None
        for rank, rec in zip(fut.ranks, records):
            rec = dict(rec or {})
            dp_rank = rec.pop("dp_rank", None)
            if dp_rank is None and fut.spec.dispatch_mode in _DP_MODES:
                dp_rank = rank
            extra = {k: rec.pop(k) for k in ("recv_rows", "recv_tokens", "out_rows", "out_tokens", "elapsed_s")}
            extra.update(method=fut.method, mode=fut.spec.mode_name, collected=collected[rank])
            self.trace.ranks.append(
                RankRecord(
                    stage=fut.stage,
                    rank=rank,
                    dp_rank=dp_rank,
                    tp_rank=rec.get("tp_rank"),
                    sp_rank=rec.get("sp_rank"),
                    rows=rec["rows"],
                    tokens=rec["tokens"],
                    collectives=rec.get("collectives", {}),
                    extra=extra,
                )
            )
            per_rank = extra["recv_rows"] if per_rank is None or per_rank == extra["recv_rows"] else -1
        if fut.stage not in self.trace.stage_names():
            self.trace.stages.append(
                StageRecord(
                    name=fut.stage,
                    title=f"{fut.method} [{fut.spec.mode_name}]",
                    global_rows=fut.global_rows,
                    per_rank_rows=None if per_rank in (None, -1) else per_rank,
                    formula=f"dispatched by {fut.spec.mode_name} over {self.world_size} ranks",
                    where="labkit.runtime.worker_group",
                )
            )


def _abandoned(rank: int, method: str, why: str) -> dict[str, Any]:
    """The envelope of a rank still running when the call was given up (it sorts last among the causes)."""
    return {
        "ok": False,
        "rank": rank,
        "method": method,
        "exc_type": "Abandoned",
        "pending": True,
        "message": f"rank {rank} still running when {why}",
        "traceback": "",
    }


def _pick_launcher(launcher: str) -> str:
    from labkit.runtime.ray_launcher import ray_available

    if launcher == "auto":
        return "ray" if ray_available() else "local"
    if launcher not in ("ray", "local"):
        raise ValueError(f"launcher must be 'ray', 'local' or 'auto', got {launcher!r}")
    if launcher == "ray" and not ray_available():
        raise ImportError("launcher='ray' but Ray is not installed here; use launcher='local' (or 'auto')")
    return launcher
