"""An existing Ray cluster, joined through RAY_ADDRESS: a real `ray start --head` on 127.0.0.1, run as its own cluster,
takes a worker group and a full GRPO step from a driver labkit runs, and labkit's cleanup (the group's close and the
driver's exit) leaves the cluster's own processes running. The test then stops the cluster itself."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from _procs import cmdline, descendants

from labkit.runtime.processes import pid_alive
from labkit.runtime.ray_init import ray_available

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not ray_available(), reason="Ray is not installed here")]
ROOT = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")

DRIVER = textwrap.dedent(
    """
    import json, math
    from labkit.runtime.demo_worker import DemoWorker
    from labkit.runtime.ray_init import import_ray
    from labkit.runtime.worker_group import WorkerGroup
    from labkit.trainer.grpo_trainer import GRPOTrainer

    if __name__ == "__main__":
        wg = WorkerGroup(DemoWorker, 2, launcher="ray", timeout_s=120)
        echoed = wg.echo(3)
        wg.close()
        tr = GRPOTrainer(["actor_rollout_ref.rollout.name=hf"], launcher="ray", seed=0, progress=False,
                         fixed_prompts=True, timeout_s=240)
        try:
            metrics = tr.step()
        finally:
            report = tr.close()
        finite = all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
        print(json.dumps({"echoed": echoed, "metrics_finite": finite, "left_pids": report["left_pids"],
                          "ray_connected_after_close": import_ray().is_initialized()}))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _core_pids(head_pid: int) -> set[int]:
    """The cluster's gcs_server and raylet (below the `ray start --block` process)."""
    return {p for p in descendants(head_pid) if cmdline(p).split(" ")[0].endswith(("/gcs_server", "/raylet"))}


def _status(port: int, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(RAY), "status", f"--address=127.0.0.1:{port}"], env=env, capture_output=True, text=True, timeout=60
    )


RAY_STARTUP_TIMEOUT = "The current node timed out during startup"
"""Ray's own message when its raylet does not register within its fixed 30 s (``ray/_private/node.py``): the
machine was too busy for `ray start`, not a fault of labkit's; the head is started once more then."""


def _start_head(env: dict[str, str]) -> tuple[subprocess.Popen, int, str]:
    """`ray start --head --block` on a free port, returned once gcs_server and raylet are up and the node has
    registered (on busy cores `ray status` answers before that, and a driver joining then finds no node to connect
    to: "No node info found matching attributes")."""
    for attempt in (1, 2):
        port = _free_port()
        temp_dir = tempfile.mkdtemp(prefix="lkray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        head = subprocess.Popen(
            [str(RAY), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=4",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while len(_core_pids(head.pid)) < 2 or " node_" not in _status(port, env).stdout:
            if head.poll() is not None:
                err = head.stderr.read().decode()
                _stop(head, temp_dir)
                if attempt == 1 and RAY_STARTUP_TIMEOUT in err:
                    print("ray start timed out on busy cores (Ray's own 30 s raylet wait); starting it once more")
                    break
                raise AssertionError(f"ray start exited: {err[-2000:]}")
            if time.monotonic() > deadline:
                _stop(head, temp_dir)
                raise AssertionError("the Ray head did not start in 90 s")
            time.sleep(1)
        else:
            return head, port, temp_dir
    raise AssertionError("unreachable")


def _stop(head: subprocess.Popen, temp_dir: str) -> None:
    """SIGTERM the head's session (gcs_server and raylet are in it), SIGKILL what is left; a session already gone
    is fine."""
    pids = descendants(head.pid)
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            break
        try:
            head.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_grpo_step_on_an_existing_ray_cluster_leaves_the_cluster_running():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    head, port, temp_dir = _start_head(env)
    try:
        before = _core_pids(head.pid)
        out = subprocess.run(
            [sys.executable, "-c", DRIVER], env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}, cwd=ROOT,
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["echoed"] == [{"rank": 0, "x": 3}, {"rank": 1, "x": 3}]
        assert result["metrics_finite"] and result["left_pids"] == []
        assert not result["ray_connected_after_close"], "the driver's connection to the cluster is given back"
        assert "joining the Ray cluster at RAY_ADDRESS=127.0.0.1:" in out.stderr
        assert len(before) == 2 and all(pid_alive(p) for p in before), "labkit's cleanup stopped the cluster"
        status = _status(port, env)
        assert status.returncode == 0 and "CPU" in status.stdout, status.stderr[-2000:]
    finally:
        _stop(head, temp_dir)
