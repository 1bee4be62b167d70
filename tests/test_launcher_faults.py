"""A local launcher whose start fails reports the failure itself, whatever was started before it."""

from __future__ import annotations

import pytest

from labkit.runtime import local_launcher
from labkit.runtime.local_launcher import LocalLauncher


def test_a_failed_start_raises_its_cause_not_an_index_error(monkeypatch):
    def fail_before_any_rank(self, ctx, host_kwargs):
        raise RuntimeError("the fork server could not start rank 0")

    monkeypatch.setattr(local_launcher.LocalLauncher, "_spawn", fail_before_any_rank)
    with pytest.raises(RuntimeError, match="could not start rank 0"):
        LocalLauncher(2, [{}, {}], start_method="spawn")


@pytest.mark.parametrize("key", ["timeout_s", "collective_timeout_s"])
def test_a_huge_timeout_is_refused_before_any_process_starts(key):
    from labkit.runtime.demo_worker import DemoWorker
    from labkit.runtime.worker_group import WorkerGroup

    with pytest.raises(ValueError, match=f"{key} must be at most 2,592,000 seconds"):
        WorkerGroup(DemoWorker, 2, launcher="local", **{key: 1e14})


DRIVER = """
from labkit.runtime.demo_worker import DemoWorker
from labkit.runtime.worker_group import WorkerGroup

if __name__ == "__main__":
    wg = WorkerGroup(DemoWorker, 2, launcher="local", timeout_s=120)
    print(" ".join(map(str, wg.pids)), flush=True)
    wg.sleep(600)  # every rank busy in a call: none of them reads its pipe
"""


@pytest.mark.slow
def test_local_ranks_exit_when_their_driver_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from labkit.runtime.processes import DRIVER_POLL_S, pid_alive

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    root = Path(__file__).resolve().parents[1]
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=root)
    pids: list[int] = []
    try:
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 2 and all(map(pid_alive, pids)), pids
        time.sleep(1.0)
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        deadline = time.monotonic() + 10 * DRIVER_POLL_S + 5
        while any(map(pid_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in pids if pid_alive(p)]
        assert not left, f"ranks {left} outlived their SIGKILLed driver"
    finally:
        driver.kill()
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_an_unpicklable_return_value_is_an_error_that_says_why():
    """A method whose value cannot be pickled fails with that reason on every rank; the ranks stay alive."""
    import weakref

    import torch

    from labkit.protocol.data_proto import DataProto
    from labkit.runtime.demo_worker import DemoWorker
    from labkit.runtime.worker_group import WorkerGroup

    wg = WorkerGroup(DemoWorker, 2, launcher="local", timeout_s=60)
    try:
        data = DataProto.from_dict({"input_ids": torch.zeros(4, 3, dtype=torch.long)})
        with pytest.raises(Exception, match=r"return value of with_func cannot be sent to the driver \(pickle: "):
            wg.with_func(weakref.ref, data)
        assert len(wg.alive_pids()) == 2
        assert wg.echo(1)[0]["x"] == 1  # the group still serves calls
    finally:
        wg.close()


@pytest.mark.slow
def test_processes_a_rank_started_die_with_the_group():
    import time

    from labkit.runtime.demo_worker import DemoWorker
    from labkit.runtime.processes import pid_alive
    from labkit.runtime.worker_group import WorkerGroup

    wg = WorkerGroup(DemoWorker, 2, launcher="local", timeout_s=60)
    try:
        children = wg.start_child(600)
        assert len(children) == 2 and all(map(pid_alive, children))
    finally:
        wg.close()
    deadline = time.monotonic() + 2.0  # SIGKILL is delivered asynchronously
    while any(map(pid_alive, children)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in children if pid_alive(p)]
    assert not left, f"children {left} of the ranks outlived close()"
