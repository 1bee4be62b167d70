"""The in-rank host: sets the environment, joins the process group, builds the worker, runs calls, reports status.

Used as-is by the local launcher and wrapped as a Ray actor by labkit.runtime.ray_launcher. A rank never raises across the
process boundary: every outcome is an envelope of plain data (value + trace record, or error + remote traceback)."""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

from labkit.runtime import collective_log, dist, meshes, process_group
from labkit.runtime.dispatch import first_batch_arg, is_data_proto, rows_tokens

CALL_QUERY = "_lk_query"  # built-in: a rank's registered dispatch info (dp_rank / is_collect) for a mesh


def error_envelope(rank: int, method: str, exc: BaseException) -> dict[str, Any]:
    """A rank's exception as plain data: type, message, remote traceback text, collective if any."""
    env = {
        "ok": False,
        "rank": rank,
        "method": method,
        "exc_type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "pid": os.getpid(),
    }
    if isinstance(exc, dist.CollectiveTimeout):
        env["collective"] = {
            "collective": exc.collective,
            "group": exc.group_ranks,
            "elapsed_s": exc.elapsed_s,
            "timeout_s": exc.timeout_s,
        }
        env["report"] = exc.report or dist.rank_report()
    elif _raised_in_torch_distributed(exc):  # e.g. a raw torch.distributed collective timed out: the group is suspect
        env["pg_error"] = True
        env["report"] = dist.report_for(exc)
    if env.get("report"):  # the per-rank dump: after the remote traceback, and on its own for the driver's error
        env["report_text"] = format_report(env["report"])
        env["traceback"] += env["report_text"]
    return env


def format_report(report: dict[str, Any]) -> str:
    """A rank_report as the lines of a per-rank hang dump: where the rank is, its counts, its Python stack."""
    where = f"stage {report.get('stage')}, micro-batch {report.get('micro_batch')}"
    if report.get("waiting_in") and report.get("call") is None:  # a collective torch ran itself (FSDP)
        what = f"failed in {report['waiting_in']} (a collective torch runs itself)"
    elif report.get("waiting_in"):
        what = (
            f"waiting in {report['waiting_in']} (call #{report.get('call')}) over ranks {report.get('group')} "
            f"for {report.get('waited_s') or 0:.1f} s"
        )
    else:
        what = f"not in a collective; last completed {report.get('last_completed')} (call #{report.get('call')})"
    counts = ", ".join(f"{k}×{v}" for k, v in sorted((report.get("counts") or {}).items())) or "none"
    stack = "".join(report.get("stack") or []).rstrip()
    return (
        f"--- hang report of rank {report.get('rank')} (pid {report.get('pid')}) ---\n{where}: {what}\n"
        f"completed collectives: {counts}\nPython stack (innermost last):\n{stack}\n"
    )


def not_ready_envelope(rank: int, waited_s: float, timeout_s: float) -> dict[str, Any]:
    """The envelope of a rank that did not report ready within the start timeout (a launcher's wait_ready)."""
    return {
        "ok": False,
        "rank": rank,
        "method": "__init__",
        "exc_type": "NotReady",
        "pending": True,
        "message": f"rank {rank} not ready after {waited_s:.1f} s (start_timeout_s={timeout_s:g})",
        "traceback": "",
    }


_C10D_FILES = ("distributed_c10d.py", "c10d_logger.py", "_functional_collectives.py")


def _raised_in_torch_distributed(exc: BaseException) -> bool:
    """True when the exception came out of a raw torch.distributed collective (not labkit.runtime.dist's guard)."""
    if not isinstance(exc, RuntimeError):
        return False
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if "/torch/distributed/" in name and name.rsplit("/", 1)[-1] in _C10D_FILES:
            return True
        tb = tb.tb_next
    return False


class RankHost:
    """One rank: sets env, joins the process group, builds the worker, runs calls, reports status and teardown."""

    def __init__(
        self,
        worker_cls: type,
        rank: int,
        world_size: int,
        master_port: int,
        init_kwargs: dict,
        env: dict[str, str],
        backend: str,
        device_kind: str,
        collective_timeout_s: float,
        rendezvous_timeout_s: float = 300.0,
    ) -> None:
        self.rank, self.pid = rank, os.getpid()
        self.worker: Any = None
        self.error: dict | None = None
        self.current: str | None = None
        try:
            os.environ.update({k: str(v) for k, v in (env or {}).items()})
            import torch

            torch.set_num_threads(1)
            process_group.init_dist(
                rank,
                world_size,
                master_port,
                backend=backend,
                device_kind=device_kind,
                timeout_s=collective_timeout_s,
                rendezvous_timeout_s=rendezvous_timeout_s,
            )
            self.current = "__init__"
            self.worker = worker_cls(**(init_kwargs or {}))
        except BaseException as exc:  # reported through ready(); the driver closes the group
            self.error = error_envelope(rank, "__init__", exc)
        finally:
            self.current = None

    def ready(self) -> dict[str, Any]:
        """{"ok", "rank", "pid"} or the constructor's error envelope."""
        return self.error or {"ok": True, "rank": self.rank, "pid": self.pid}

    def call(
        self, method: str, args: tuple, kwargs: dict, gather_group: str | None = None, mesh_name: str | None = None
    ) -> dict[str, Any]:
        """Run one method; returns {"ok", "value", "record"} or an error envelope (never raises)."""
        self.current = method
        try:
            if self.error is not None:
                raise RuntimeError(f"rank {self.rank} failed in __init__: {self.error['message']}")
            if method == CALL_QUERY:
                return {"ok": True, "rank": self.rank, "value": self.worker._lk_query(*args), "record": None}
            return self._call(method, args, kwargs, gather_group, mesh_name)
        except BaseException as exc:
            return error_envelope(self.rank, method, exc)
        finally:
            self.current = None

    def _call(
        self, method: str, args: tuple, kwargs: dict, gather_group: str | None, mesh_name: str | None
    ) -> dict[str, Any]:
        collective_log.mark_call_thread()
        before = dist.collective_counts()
        t0 = time.perf_counter()
        recv_rows, recv_tokens = rows_tokens(first_batch_arg(args, kwargs))
        coords = self.worker.rank_coords(mesh_name)
        group = None
        if gather_group is not None:
            if gather_group not in self.worker._lk_groups:
                raise KeyError(
                    f"rank {self.rank}: no process group named {gather_group!r} registered by "
                    f"{type(self.worker).__name__} (register_group)"
                )
            group, coord, group_mesh = self.worker._lk_groups[gather_group]
            coords = self.worker.rank_coords(group_mesh)
            coords[coord] = meshes.group_rank(group)
            args = tuple(dist.all_gather_data_proto(a, group) if is_data_proto(a) else a for a in args)
            kwargs = {k: dist.all_gather_data_proto(v, group) if is_data_proto(v) else v for k, v in kwargs.items()}
        rows, tokens = rows_tokens(first_batch_arg(args, kwargs))
        value = getattr(self.worker, method)(*args, **kwargs)
        if group is not None and is_data_proto(value):
            value = value.chunk(meshes.group_size(group))[meshes.group_rank(group)]
        out_rows, out_tokens = rows_tokens(value)
        after = dist.collective_counts()
        record = {
            "rows": rows,
            "tokens": tokens,
            "recv_rows": recv_rows,
            "recv_tokens": recv_tokens,
            "out_rows": out_rows,
            "out_tokens": out_tokens,
            "elapsed_s": time.perf_counter() - t0,
            "collectives": {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)},
            **coords,
        }
        return {"ok": True, "rank": self.rank, "value": value, "record": record}

    def status(self) -> dict[str, Any]:
        """What the rank is doing now: method and in-flight collective (answered while a call blocks)."""
        inflight = dist.inflight()
        out = {"rank": self.rank, "pid": self.pid, "method": self.current, "inflight": inflight}
        if inflight is not None:  # the watchdog asks while the call blocks: where this rank waits, and its stack
            out["report"] = dist.rank_report()
        return out

    def shutdown(self) -> dict[str, Any]:
        """The worker's own ``shutdown()`` first (e.g. a rollout engine), then destroy the process group; reports
        whether none is left. Idempotent: the local launcher calls it again when the rank's loop ends."""
        out: dict[str, Any] = {"rank": self.rank, "pid": self.pid}
        stop = getattr(self.worker, "shutdown", None)
        if callable(stop) and not getattr(self, "_worker_stopped", False):
            self._worker_stopped = True
            try:
                out["worker"] = stop()
            except BaseException as exc:
                out["worker_error"] = repr(exc)
        try:
            return {**out, "pg_destroyed": process_group.teardown()}
        except BaseException as exc:
            return {**out, "pg_destroyed": False, "error": repr(exc)}
