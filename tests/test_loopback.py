"""Nothing a worker group starts listens beyond loopback: the rank-0 rendezvous (TCPStore) and gloo's own sockets are on
127.0.0.1, and so is every process of a Ray that labkit starts (gcs_server, raylet, agents, the rank actors)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess

import pytest
from _procs import descendants

from labkit.runtime.demo_worker import DemoWorker
from labkit.runtime.worker_group import WorkerGroup

pytestmark = pytest.mark.slow


def is_loopback(address: str) -> bool:
    """Whether an ``ss`` local address (``127.0.0.1:80``, ``[::1]:80``, ``[::ffff:127.0.0.1]:80``) is loopback."""
    host = address.rsplit(":", 1)[0].strip("[]").split("%")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # "*" or "0.0.0.0": every interface
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


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
    wide = [a for a in addresses if not is_loopback(a)]
    assert not wide, f"listening beyond loopback: {wide} (all: {addresses})"


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to list listening sockets")
def test_is_loopback_reads_ss_addresses():
    assert all(map(is_loopback, ["127.0.0.1:5", "[::1]:5", "[::ffff:127.0.0.1]:5", "127.0.1.1:5"]))
    assert not any(map(is_loopback, ["*:5", "0.0.0.0:5", "[::]:5", "192.0.2.2:5", "[::ffff:192.0.2.2]:5"]))


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to list listening sockets")
def test_a_ray_labkit_starts_listens_on_loopback_only():
    pytest.importorskip("ray")
    if os.environ.get("RAY_ADDRESS"):
        pytest.skip("RAY_ADDRESS is set: the cluster is the user's, not one labkit starts")
    wg = WorkerGroup(DemoWorker, 2, launcher="ray", timeout_s=120)
    try:
        pids = descendants(os.getpid())
        addresses = listening(pids)
    finally:
        wg.close()
    assert len(pids) >= 5, f"expected the driver, gcs_server, raylet and two rank actors: {sorted(pids)}"
    assert len(addresses) >= 4, f"Ray's gRPC servers should be listed: {addresses}"
    wide = [a for a in addresses if not is_loopback(a)]
    assert not wide, f"listening beyond loopback: {wide} (all: {addresses})"
