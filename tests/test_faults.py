"""Fault injection on both launchers: each fault ends in an error that names the culprit rank (and how it failed)
within a bound, and leaves no process, /dev/shm or /tmp entry, or driver socket behind once the group is closed.

Faults: a rank raises; exits with os._exit; is SIGKILLed mid-call and mid-collective; is SIGSTOPped while its peers
wait in a collective; ranks issue mismatched collectives; a rank hangs in a collective that ignores timeouts; two
groups at once; create/close cycles; a GRPO step with a rank killed in each stage that runs on the ranks."""

from __future__ import annotations

import glob
import os
import signal
import tempfile
import threading
import time

import pytest
from _procs import new_leftovers, run_leftovers

from labkit.runtime import worker_group as controller
from labkit.runtime.demo_worker import DemoWorker
from labkit.runtime.ray_init import ray_available
from labkit.runtime.ray_launcher import start_ray, stop_ray
from labkit.runtime.worker_group import WorkerGroup

pytestmark = pytest.mark.slow
COLL_S = 3.0  # every group's collective timeout
BOUND_S = COLL_S + 2 * controller.GRACE_S + 6  # an error must be raised within this, whatever the fault
LAUNCHERS = ["local", pytest.param("ray", marks=pytest.mark.skipif(not ray_available(), reason="Ray not installed"))]


@pytest.fixture(scope="module")
def ray_up():
    """One Ray for the module's Ray cases (held, so each group does not restart it), and the local launcher's
    forkserver started before any baseline (it serves every local group of this driver, and stays by design)."""
    WorkerGroup(DemoWorker, 1, launcher="local", timeout_s=60).close()
    owned = ray_available() and start_ray(num_cpus=4)
    yield
    if owned:
        stop_ray()


@pytest.fixture(params=LAUNCHERS)
def launcher(request, ray_up):
    before = run_leftovers()
    yield request.param
    assert controller.live_groups() == [], "a test left a worker group open"
    # Ray's own processes and sockets belong to the module's Ray, not to the group: only the group's are checked there
    ignore = None if request.param == "local" else {"processes": run_leftovers()["processes"], "sockets": set()}
    if request.param == "ray":
        ignore["sockets"] = run_leftovers()["sockets"]
    assert new_leftovers(before, ignore=ignore) == {}


def _group(launcher: str, world_size: int = 3) -> WorkerGroup:
    return WorkerGroup(DemoWorker, world_size, launcher=launcher, timeout_s=60, collective_timeout_s=COLL_S)


def _fails(wg: WorkerGroup, method: str, *args, signal_after: tuple[int, int, float] | None = None):
    """Call `method`; with `signal_after=(rank, signum, delay)` signal that rank meanwhile. Returns (error, seconds)."""
    if signal_after:
        rank, signum, delay = signal_after
        pid = wg.pids[rank]
        threading.Timer(delay, os.kill, (pid, signum)).start()
    t0 = time.monotonic()
    with pytest.raises(controller.WorkerGroupError) as info:
        getattr(wg, method)(*args)
    return info.value, time.monotonic() - t0


def test_a_rank_that_raises_is_named_and_the_group_stays_usable(launcher):
    with _group(launcher) as wg:
        err, took = _fails(wg, "raise_on", 1)
        assert isinstance(err, controller.RankError) and err.rank == 1 and err.exc_type == "ValueError", err
        assert "DemoWorker told to raise on rank 1" in str(err) and took < BOUND_S
        assert wg.echo(2) == [{"rank": r, "x": 2} for r in range(3)]


def test_os_exit_names_the_rank_and_its_exit_code(launcher):
    with _group(launcher) as wg:
        err, took = _fails(wg, "exit_on", 2, 7)
        assert isinstance(err, controller.RankDiedError) and err.rank == 2, err
        assert took < BOUND_S
        if launcher == "local":
            assert "exited with code 7" in str(err)


@pytest.mark.parametrize("where", ["mid-call", "mid-collective"])
def test_sigkill_names_the_dead_rank_not_a_waiting_peer(launcher, where):
    with _group(launcher) as wg:
        method, args = ("sleep", (30,)) if where == "mid-call" else ("late_all_reduce", (1, 30))
        err, took = _fails(wg, method, *args, signal_after=(1, signal.SIGKILL, 1.0))
        assert isinstance(err, controller.RankDiedError) and err.rank == 1, err
        assert str(err).startswith(f"rank 1 failed in {method}: RankDied: rank 1 (pid {wg.pids[1]})"), err
        assert ("was killed by SIGKILL" if launcher == "local" else "killed by a signal") in str(err)
        assert took < BOUND_S


def test_a_stopped_rank_is_named_as_soon_as_its_peers_time_out(launcher):
    with _group(launcher) as wg:
        pid = wg.pids[1]
        try:
            err, took = _fails(wg, "late_all_reduce", 1, 30, signal_after=(1, signal.SIGSTOP, 0.5))
        finally:
            os.kill(pid, signal.SIGCONT)
        assert isinstance(err, controller.RankUnresponsiveError) and err.rank == 1, err
        assert "its process is stopped (state T" in str(err) and "all_reduce" in str(err)
        assert COLL_S < took < BOUND_S, f"took {took:.1f} s: the driver must not wait for timeout_s (60 s)"


def test_a_large_payload_to_a_stopped_rank_times_out_instead_of_blocking_the_driver(launcher):
    """8 MB per rank is far above a pipe's buffer: the driver used to block in the write, past every timeout."""
    wg = WorkerGroup(DemoWorker, 2, launcher=launcher, timeout_s=5, collective_timeout_s=COLL_S)
    try:
        os.kill(wg.pids[1], signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(controller.CallTimeoutError, match=r"ranks \[1\] did not answer within 5 s \(stopped"):
            wg.echo(b"x" * 8_000_000)
        assert time.monotonic() - t0 < 5 + 6
    finally:
        os.kill(wg.pids[1], signal.SIGCONT)
        wg.close()


def test_mismatched_collectives_end_in_a_collective_timeout(launcher):
    with _group(launcher) as wg:
        err, took = _fails(wg, "skip_all_reduce", 1)
        assert isinstance(err, controller.CollectiveTimeoutError) and err.rank in (0, 2), err
        assert err.collective == "all_reduce" and took < BOUND_S


def test_a_hung_rank_is_named_by_the_driver_watchdog(launcher):
    with _group(launcher) as wg:
        err, took = _fails(wg, "stuck_in_collective", 1, 60)
        assert isinstance(err, controller.CollectiveTimeoutError) and err.rank == 1, err
        assert "driver watchdog: rank 1" in str(err) and took < BOUND_S
        assert "stuck_in_collective" in err.remote_traceback, "the hung rank's report carries its Python stack"


def test_two_groups_at_once_and_create_close_cycles(launcher):
    a, b = _group(launcher, 2), _group(launcher, 2)
    try:
        assert a.all_reduce_rank() == b.all_reduce_rank() == [1.0, 1.0]
        a.close()
        assert b.echo(5) == [{"rank": 0, "x": 5}, {"rank": 1, "x": 5}]
    finally:
        a.close()
        b.close()
    for _ in range(20 if launcher == "local" else 2):  # a Ray group costs 3-10 s of actor start on 2 cores
        with _group(launcher, 2) as wg:
            assert wg.all_reduce_rank() == [1.0, 1.0]


@pytest.mark.parametrize("stage", ["gen", "old_log_prob", "update_actor"])
def test_a_grpo_step_names_the_rank_killed_in_each_stage(monkeypatch, stage):
    from labkit.trainer import grpo_trainer

    WorkerGroup(DemoWorker, 1, launcher="local", timeout_s=60).close()  # the forkserver, before the baseline
    before = run_leftovers()
    tr = grpo_trainer.GRPOTrainer(
        ["actor_rollout_ref.rollout.name=hf"], launcher="local", seed=0, progress=False, fixed_prompts=True,
        collective_timeout_s=COLL_S,
    )  # fmt: skip
    pid = tr.wg.pids[1]
    original = grpo_trainer._Progress.stage

    def kill_in(self, name):
        if name == stage:
            threading.Timer(0.2, os.kill, (pid, signal.SIGKILL)).start()
        original(self, name)

    monkeypatch.setattr(grpo_trainer._Progress, "stage", kill_in)
    t0 = time.monotonic()
    try:
        with pytest.raises(controller.RankDiedError) as info:
            tr.step()
    finally:
        report = tr.close()
    assert time.monotonic() - t0 < 60 + BOUND_S
    assert info.value.rank == 1 and f"(pid {pid}) was killed by SIGKILL" in str(info.value), info.value
    assert report["left_pids"] == [] and new_leftovers(before) == {}


DRIVER = """
import sys
from labkit.runtime.demo_worker import DemoWorker
from labkit.runtime.worker_group import WorkerGroup

if __name__ == "__main__":
    wg = WorkerGroup(DemoWorker, 2, launcher=sys.argv[1], timeout_s=120)
    print(" ".join(map(str, wg.pids)), flush=True)
    wg.sleep(600)  # every rank busy in a call
"""


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_nothing_outlives_a_killed_driver(launcher, signum, tmp_path):
    """The driver dies while its ranks are busy: its ranks and, with Ray, the Ray it started (gcs_server, raylet,
    agents, actors) are gone within seconds."""
    import subprocess
    import sys
    from pathlib import Path

    from _procs import cmdline, descendants

    from labkit.runtime.processes import pid_alive

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    root = Path(__file__).resolve().parents[1]
    driver = subprocess.Popen(
        [sys.executable, str(script), launcher], stdout=subprocess.PIPE, text=True, cwd=root, env=env
    )
    tree: set[int] = set()
    try:
        ranks = [int(p) for p in driver.stdout.readline().split()]
        assert len(ranks) == 2 and all(map(pid_alive, ranks)), ranks
        time.sleep(1.0)
        tree = descendants(driver.pid) - {driver.pid}
        assert set(ranks) <= tree or launcher == "ray"
        driver.send_signal(signum)
        driver.wait(20)
        deadline = time.monotonic() + 15
        while any(map(pid_alive, tree)) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {p: cmdline(p)[:80] for p in tree if pid_alive(p)}
        assert not left, f"outlived the {signal.Signals(signum).name} of their driver: {left}"
        while (
            glob.glob(os.path.join(tempfile.gettempdir(), f"labkit-group-{driver.pid}-*"))
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)  # the group's folder (rank_files): removed by its ranks (local) or the Ray reaper
        assert not glob.glob(os.path.join(tempfile.gettempdir(), f"labkit-group-{driver.pid}-*"))
    finally:
        driver.kill()
        for pid in tree:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_close_with_a_stopped_rank_kills_it_at_once():
    """A stopped rank cannot take SIGTERM: close() kills it without the 2 s SIGTERM wait, within the grace period
    and a second."""
    wg = WorkerGroup(DemoWorker, 2, launcher="local", timeout_s=60, collective_timeout_s=COLL_S)
    os.kill(wg.pids[1], signal.SIGSTOP)
    start = time.monotonic()
    wg.close()
    assert time.monotonic() - start < controller.CLOSE_GRACE_S + 1.0
    assert not os.path.exists(wg.group_dir)


ABANDONING_DRIVER = """
import os, sys
from labkit.runtime.demo_worker import DemoWorker
from labkit.runtime.worker_group import WorkerGroup
if __name__ == "__main__":
    wg = WorkerGroup(DemoWorker, 1, launcher="local", timeout_s=60)
    print(wg.group_dir, flush=True)
    os._exit(0)  # no close(), no atexit: the folder is abandoned
"""


def test_an_abandoned_group_folder_is_swept_by_the_next_start(tmp_path):
    """A driver that ends with os._exit(0) leaves its group folder; the next labkit group start in the same temp
    folder removes it (its driver's pid is gone) and leaves a live driver's folder alone."""
    import shutil
    import subprocess
    import sys

    folder = tempfile.mkdtemp(prefix="ab-")  # short: the forkserver's socket path must fit AF_UNIX's 108 bytes
    env = {**os.environ, "TMPDIR": folder}
    script = tmp_path / "driver.py"
    script.write_text(ABANDONING_DRIVER)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip(), out.stderr[-1500:]
    abandoned = out.stdout.strip().splitlines()[-1]
    assert os.path.isdir(abandoned), out.stderr[-500:]
    mine = tempfile.mkdtemp(prefix=f"labkit-group-{os.getpid()}-", dir=folder)  # a live driver's folder
    code = "from labkit.runtime import rank_files; print(rank_files.sweep_abandoned())"
    swept = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert abandoned in swept.stdout and not os.path.exists(abandoned), swept.stderr[-500:]
    assert os.path.isdir(mine)
    shutil.rmtree(folder)
