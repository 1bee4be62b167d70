"""The pipes between the driver and a local rank: payloads pickled with plain ``pickle`` (never ForkingPickler, whose
shared-memory tensors can hang the parent), the driver's per-rank writer thread (``Outbox``) and the rank's status
server (its second pipe, answered while a call runs). Used by ``labkit.runtime.local_launcher`` at both ends."""

from __future__ import annotations

import pickle
import queue
import threading
from typing import Any

from labkit.runtime.rank_host import RankHost


def dumps(obj: Any) -> bytes:
    """One pipe message (plain pickle, highest protocol)."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def send(conn: Any, obj: Any) -> None:
    """Write one message to a pipe end."""
    conn.send_bytes(dumps(obj))


def recv(conn: Any) -> Any:
    """Read one message from a pipe end (blocks)."""
    return pickle.loads(conn.recv_bytes())


class Outbox:
    """A rank's inbound pipe written by a thread of its own, in order: a payload larger than the pipe buffer, for a
    rank busy in an earlier call or stopped, never blocks the driver past its timeouts (the watchdog still runs)."""

    def __init__(self, rank: int, conn: Any, on_error: Any) -> None:
        self.rank, self.conn, self.on_error = rank, conn, on_error
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="labkit-outbox")
        self.thread.start()

    def put(self, payload: bytes, call_id: int | None = None) -> None:
        self.queue.put((payload, call_id))

    def stop(self) -> None:
        self.queue.put(None)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            payload, call_id = item
            try:
                self.conn.send_bytes(payload)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
                self.on_error(self.rank, call_id, exc)


def serve_status(conn: Any, host: RankHost) -> None:
    """Answer every status request on the rank's status pipe with host.status() until the pipe closes."""
    try:
        while True:
            conn.recv_bytes()
            send(conn, host.status())
    except (EOFError, OSError):
        return
