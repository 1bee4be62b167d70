"""Nothing a local worker group starts listens beyond loopback: the rank-0 rendezvous (TCPStore) and gloo's own
sockets are on 127.0.0.1. (A Ray that labkit starts still listens on every interface: an open item.)"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from labkit.runtime.demo_worker import DemoWorker
from labkit.runtime.worker_group import WorkerGroup

pytestmark = pytest.mark.slow


def listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets that ``pids`` listen on (``ss -ltnp``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to list listening sockets")
def test_a_local_group_listens_on_loopback_only():
    wg = WorkerGroup(DemoWorker, 2, launcher="local", timeout_s=120)
    try:
        addresses = listening({os.getpid(), *wg.alive_pids()})
    finally:
        wg.close()
    assert addresses, "the ranks' rendezvous and gloo sockets should be listed"
    wide = [a for a in addresses if not a.startswith(("127.", "[::1]"))]
    assert not wide, f"listening beyond loopback: {wide} (all: {addresses})"
