"""The local-process launcher, the fallback where Ray is absent (the GPU box): ranks forked from a preloaded
multiprocessing fork server (or spawned), one command pipe and one status pipe per rank (``labkit.runtime.rank_pipes``),
and the rank's entry point, which serves calls until shutdown. Mirrors the role of
verl/single_controller/ray/base.py: RayWorkerGroup."""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing import util as mp_util
from multiprocessing.connection import wait as mp_wait
from typing import Any

from labkit.runtime.processes import exit_text, exit_without_driver, process_state
from labkit.runtime.rank_host import RankHost, error_envelope, not_ready_envelope
from labkit.runtime.rank_pipes import Outbox, dumps, recv, send, serve_status

__all__ = ["LocalLauncher", "stop_forkserver", "local_rank_main", "FORKSERVER_PRELOAD"]


def local_rank_main(
    conn: Any, status_conn: Any, host_kwargs: dict, driver_pid: int | None = None, driver_tempdir: str | None = None
) -> None:
    """Entry point of a spawned rank: build the host, then serve calls until shutdown or the pipe closes (or the
    driver process ``driver_pid`` dies)."""
    os.setpgrp()  # the rank leads a process group of its own: close() takes down whatever the rank started too
    if driver_pid is not None:
        threading.Thread(target=exit_without_driver, args=(driver_pid, driver_tempdir), daemon=True).start()
    host = RankHost(**host_kwargs)
    threading.Thread(target=serve_status, args=(status_conn, host), daemon=True).start()
    send(conn, ("ready", host.ready()))
    while True:
        try:
            msg = recv(conn)
        except (EOFError, OSError):
            break
        if msg[0] == "call":
            _, call_id, method, args, kwargs, opts = msg
            result = host.call(method, args, kwargs, **opts)
            try:
                payload = dumps(("result", call_id, result))
            except Exception as exc:  # the value cannot cross the process boundary: say so instead of dying
                why = TypeError(f"the return value of {method} cannot be sent to the driver (pickle: {exc})")
                payload = dumps(("result", call_id, error_envelope(host.rank, method, why)))
            conn.send_bytes(payload)
        elif msg[0] == "shutdown":
            send(conn, ("bye", host.shutdown()))
            break
    host.shutdown()


FORKSERVER_PRELOAD = [
    "labkit.runtime.local_launcher",
    "labkit.runtime.rank_host",
    "labkit.protocol.data_proto",
    "torch.distributed.device_mesh",
]


def stop_forkserver() -> None:
    """Stop multiprocessing's fork server (started by the first local group; it holds the preloaded imports)."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


class LocalLauncher:
    """W rank processes on this machine, forked from a preloaded fork server (default) or spawned; same interface as
    RayLauncher. The fork server costs one torch/tensordict import per driver instead of one per rank."""

    name = "local"

    def __init__(self, world_size: int, host_kwargs: list[dict], start_method: str | None = None) -> None:
        import torch.multiprocessing as mp

        method = start_method or os.environ.get("LABKIT_START_METHOD", "forkserver")
        if method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {method!r}")
        ctx = mp.get_context(method)
        if method == "forkserver":  # one process imports torch/tensordict once; ranks are forked from it
            ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        self.world_size = world_size
        self.procs, self.conns, self.status_conns, self.pids = [], [], [], []
        self._results: dict[int, dict[int, dict]] = {}
        self._methods: dict[int, str] = {}  # method of each call id (for the envelopes of failed sends)
        self.outboxes: list[Outbox] = []
        self._next_id = 0
        if method == "forkserver":  # forked ranks inherit the server's environment: hand them the driver's, as spawn
            host_kwargs = [{**kw, "env": {**os.environ, **(kw.get("env") or {})}} for kw in host_kwargs]
        try:
            self._spawn(ctx, host_kwargs)  # fills self.pids as ranks start, so a failed start can close them
        except BaseException:
            self.close(graceful_s=0.0)
            raise

    def _spawn(self, ctx: Any, host_kwargs: list[dict]) -> None:
        for rank in range(self.world_size):
            parent, child = ctx.Pipe(duplex=True)
            sparent, schild = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=local_rank_main,
                args=(child, schild, host_kwargs[rank], os.getpid(), mp_util.get_temp_dir()),
                name=f"labkit-rank{rank}",
                daemon=True,
            )
            proc.start()
            child.close()
            schild.close()
            self.procs.append(proc)
            self.conns.append(parent)
            self.outboxes.append(Outbox(len(self.outboxes), parent, self._send_failed))
            self.status_conns.append(sparent)
            self.pids = [p.pid for p in self.procs]

    def wait_ready(self, timeout_s: float) -> dict[int, dict]:
        """Ready envelopes by rank (a rank that died or stayed silent gets an error envelope)."""
        out: dict[int, dict] = {}
        start = time.monotonic()
        deadline = start + timeout_s
        while len(out) < self.world_size and time.monotonic() < deadline:
            for rank, env in self._drain(0.2).items():
                out.setdefault(rank, env)
            if any(not e["ok"] for e in out.values()):
                break  # a rank failed to start: its peers may wait for it forever; the driver closes them all
        for rank in range(self.world_size):
            out.setdefault(rank, not_ready_envelope(rank, time.monotonic() - start, timeout_s))
        return out

    def _dead_envelope(self, rank: int, method: str) -> dict:
        code = self.procs[rank].exitcode
        return {
            "ok": False,
            "rank": rank,
            "method": method,
            "exc_type": "RankDied",
            "died": True,
            "exit_code": code,
            "message": f"rank {rank} (pid {self.pids[rank]}) {exit_text(code)}",
            "traceback": "",
        }

    def _drain(self, timeout: float) -> dict[int, dict]:
        """Read every message available within `timeout`; results are filed by call id, ready/death returned."""
        ready: dict[int, dict] = {}
        live = {c: r for r, c in enumerate(self.conns) if not c.closed}
        sentinels = {self.procs[r].sentinel: r for r in live.values()}
        for obj in mp_wait(list(live) + list(sentinels), timeout):
            if obj in sentinels:
                continue
            rank = live[obj]
            try:
                msg = recv(obj)
            except (EOFError, OSError):
                obj.close()
                continue
            if msg[0] == "ready":
                ready[rank] = msg[1]
            elif msg[0] == "result":
                self._results.setdefault(msg[1], {})[rank] = msg[2]
        for rank, proc in enumerate(self.procs):
            if not proc.is_alive() and rank not in ready:
                ready[rank] = self._dead_envelope(rank, "__init__")
        return ready

    def submit(
        self, ranks: list[int], method: str, per_rank_args: list[tuple], per_rank_kwargs: list[dict], opts: dict
    ) -> tuple[int, list[int], str]:
        call_id = self._next_id = self._next_id + 1
        # pickle every rank's message first: an unpicklable argument fails here, before any rank starts the call
        payloads = {
            rank: dumps(("call", call_id, method, per_rank_args[rank], per_rank_kwargs[rank], opts)) for rank in ranks
        }
        for rank in ranks:
            self.outboxes[rank].put(payloads[rank], call_id)
        self._methods[call_id] = method
        return call_id, list(ranks), method

    def _send_failed(self, rank: int, call_id: int | None, exc: BaseException) -> None:
        """An outbox could not write a call to its rank: a dead rank's envelope, or the pipe error itself."""
        if call_id is None:
            return  # a shutdown message: close() kills what does not answer
        method = self._methods.get(call_id, "?")
        if not self.procs[rank].is_alive():
            env = self._dead_envelope(rank, method)
        else:
            env = {"ok": False, "rank": rank, "method": method, "exc_type": type(exc).__name__, "traceback": "",
                   "message": f"the driver could not send the call to rank {rank}: {exc}"}  # fmt: skip
        self._results.setdefault(call_id, {}).setdefault(rank, env)

    def poll(self, handle: tuple[int, list[int], str], timeout: float) -> dict[int, dict]:
        """Envelopes of `handle` that have arrived (a dead rank's envelope says so)."""
        call_id, ranks, method = handle
        self._drain(timeout)
        got = self._results.get(call_id, {})
        for rank in ranks:
            if rank not in got and not self.procs[rank].is_alive():
                self._drain(0)  # a last message may still be in the pipe
                got.setdefault(rank, self._dead_envelope(rank, method))
        if len(got) == len(ranks):
            self._results.pop(call_id, None)
        return dict(got)

    def status(self, ranks: list[int], timeout: float = 1.0) -> dict[int, dict | None]:
        out: dict[int, dict | None] = {}
        for rank in ranks:
            conn = self.status_conns[rank]
            try:
                conn.send_bytes(b"?")
                out[rank] = recv(conn) if conn.poll(timeout) else None
            except (EOFError, OSError, BrokenPipeError):
                out[rank] = None
        return out

    def close(self, graceful_s: float = 3.0) -> list[dict]:
        """Ask every rank to destroy its process group, then terminate/kill whatever is still alive: within
        ``graceful_s`` + 2 s per rank that ignores SIGTERM (a stopped rank is killed at once, so it costs none)."""
        reports: dict[int, dict] = {}
        for rank, outbox in enumerate(self.outboxes[: len(self.procs)]):  # a spawn that failed partway has fewer
            if self.procs[rank].is_alive():
                outbox.put(dumps(("shutdown",)))
        deadline = time.monotonic() + graceful_s
        for rank, conn in enumerate(self.conns[: len(self.procs)]):
            while rank not in reports and self.procs[rank].is_alive() and time.monotonic() < deadline:
                try:
                    if conn.poll(0.05):
                        msg = recv(conn)
                        if msg[0] == "bye":
                            reports[rank] = msg[1]
                except (EOFError, OSError):
                    break
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive() and process_state(proc.pid) not in ("T", "t"):  # a stopped rank cannot take SIGTERM
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for pid in self.pids:  # processes a rank started (its process group) die with it
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for outbox in self.outboxes:
            outbox.stop()
        for conn in self.conns + self.status_conns:
            conn.close()
        return [
            reports.get(
                r,
                {"rank": r, "pid": self.pids[r] if r < len(self.pids) else None, "pg_destroyed": None, "killed": True},
            )
            for r in range(self.world_size)  # after a failed start, ranks past the failure never got a pid
        ]
