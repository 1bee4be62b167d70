"""WorkerGroup on real Ray actors and on local processes: verl's dispatch/collect rules, the live trace, errors that
name the rank, collectives that time out instead of hanging, and nothing left behind after close()."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from labkit.protocol.data_proto import DataProto
from labkit.runtime import ray_launcher
from labkit.runtime import worker_group as controller
from labkit.runtime.demo_worker import DemoWorker, add_one_to_ids
from labkit.runtime.live_call import LiveFuture
from labkit.runtime.processes import pid_alive
from labkit.runtime.ray_init import import_ray, ray_available
from labkit.runtime.ray_launcher import start_ray, stop_ray
from labkit.runtime.worker_group import (
    CollectiveTimeoutError,
    RankError,
    WorkerGroup,
    WorkerGroupError,
    live_groups,
)
from labkit.trace import RankRecord, StepTrace, compare

COLL_S = 3.0  # collective timeout of every group here: hangs must end within COLL_S + a few seconds
needs_ray = pytest.mark.skipif(not ray_available(), reason="Ray is not installed here")
_CLOSED: list[WorkerGroup] = []


def _rank_host_procs() -> list[int]:
    """PIDs of live Ray actor processes hosting a labkit rank (their title is ray::RayRankHost...)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().startswith(b"ray::RayRankHost") and pid_alive(int(entry)):
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def _assert_clean(wg: WorkerGroup) -> None:
    """After close(): every rank process gone, every surviving rank destroyed its process group."""
    assert wg.closed and wg.alive_pids() == [], f"rank processes left: {wg.alive_pids()}"
    for rep in wg.teardown:
        assert rep.get("pg_destroyed") is True or rep.get("killed"), rep


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """After every test: groups it closed left no process; only the module's shared groups are still open."""
    before = set(map(id, live_groups()))
    yield
    for wg in _CLOSED:
        _assert_clean(wg)
    _CLOSED.clear()
    assert set(map(id, live_groups())) <= before


def make_data(rows: int, rng: np.random.Generator, *, auto_padding: bool = False, width: int = 8) -> DataProto:
    lengths = rng.integers(1, width + 1, size=rows)
    mask = (torch.arange(width)[None, :] < torch.as_tensor(lengths)[:, None]).long()
    return DataProto.from_dict(
        tensors={"row_id": torch.arange(rows), "attention_mask": mask},
        non_tensors={"uid": np.array([f"p{i // 2}" for i in range(rows)], dtype=object)},
        auto_padding=auto_padding,
    )


def _mask_tokens(data: DataProto, lo: int, hi: int) -> int:
    return int(data.batch["attention_mask"][lo:hi].sum())


# ---- dispatch semantics, shared by every group --------------------------------------------------------------------
def check_modes(wg: WorkerGroup, seed: int) -> None:
    """Every predefined mode on one group: what each rank received, collect order, trace, padding, E26."""
    W, rng = wg.world_size, np.random.default_rng(seed)
    assert wg.echo("x") == [{"rank": r, "x": "x"} for r in range(W)]  # ONE_TO_ALL
    assert wg.per_rank([f"a{r}" for r in range(W)]) == [(r, f"a{r}") for r in range(W)]  # ALL_TO_ALL, split
    assert wg.per_rank(7) == [(r, 7) for r in range(W)]  # ALL_TO_ALL, broadcast
    assert wg.dp_item(list(range(10, 10 + W))) == [(r, 10 + r) for r in range(W)]  # DP_COMPUTE
    with pytest.raises(AssertionError, match=f"world_size={W}"):
        wg.dp_item(list(range(W + 1)))
    assert wg.all_reduce_rank() == [float(sum(range(W)))] * W
    assert wg.whoami() == 0  # Execute.RANK_ZERO
    fut = wg.echo_async(3)
    assert isinstance(fut, LiveFuture) and fut.get() == [{"rank": r, "x": 3} for r in range(W)]

    wg.reset_trace()
    for trial in range(3):  # DP_COMPUTE_PROTO
        per = int(rng.integers(1, 4))
        data = make_data(per * W, rng)
        out = wg.compute(data, _stage=f"dp{trial}")
        assert out.batch["row_id"].tolist() == list(range(per * W))
        assert out.batch["rank"].tolist() == [r for r in range(W) for _ in range(per)]
        recs = wg.trace.at(f"dp{trial}")
        assert [(x.rank, x.dp_rank, x.rows) for x in recs] == [(r, r, per) for r in range(W)]
        assert [x.tokens for x in recs] == [_mask_tokens(data, r * per, (r + 1) * per) for r in range(W)]
        assert all(x.extra["collected"] and x.extra["out_rows"] == per for x in recs)
        assert wg.trace.stage(f"dp{trial}").global_rows == per * W

    metrics = wg.metric(make_data(2 * W, rng))  # DP_COMPUTE_METRIC
    assert metrics == [{"rank": r, "rows": 2} for r in range(W)]
    fout = wg.with_func(add_one_to_ids, make_data(W, rng))  # ..._WITH_FUNC
    assert fout.batch["row_id"].tolist() == list(range(1, W + 1))

    if W > 1:  # E26, then padding
        bad = make_data(W + 1, rng)
        with pytest.raises(AssertionError) as err:
            wg.compute(bad)
        assert str(err.value) == f"only support equal chunk. Got size of DataProto {W + 1} and chunk {W}."
        padded = make_data(W + 1, rng, auto_padding=True)
        out = wg.compute(padded, _stage="padded")
        assert len(out) == W + 1 and out.batch["row_id"].tolist() == list(range(W + 1))
        assert len(padded) == 2 * W  # verl pads the caller's DataProto in place with copies of its last row
        assert padded.batch["row_id"].tolist()[W + 1 :] == [W] * (W - 1)
        assert [x.rows for x in wg.trace.at("padded")] == [2] * W

    with pytest.raises(RankError) as err:  # a rank raises
        wg.raise_on(W - 1)
    assert err.value.rank == W - 1 and f"rank {W - 1}" in str(err.value)
    assert "ValueError: DemoWorker told to raise" in err.value.remote_traceback
    assert "raise_on" in err.value.remote_traceback
    assert wg.echo(1)[0] == {"rank": 0, "x": 1}  # no collective was involved: the group stays usable


def check_meshes(wg: WorkerGroup, seed: int) -> None:
    """W=4, sp=2, tp=2: nd dispatch by mesh (same rows to both ranks of a group, one collected) and the ≤v0.5
    all-gather variant (compute on B·tp/W rows, outputs sliced back)."""
    rng = np.random.default_rng(seed)
    assert wg.dispatch_info("actor") == [0, 0, 1, 1] and wg.collect_info("actor") == [True, False, True, False]
    assert wg.dispatch_info("rollout") == [0, 0, 1, 1] and wg.collect_info("rollout") == [True, False, True, False]
    assert wg.dp_size("actor") == 2
    info = wg.info()
    assert [i["sp_group"] for i in info] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [i["tp_group"] for i in info] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all(i["backend"] == wg.backend for i in info)
    wg.reset_trace()
    for method, coord in (("actor_compute", "sp_rank"), ("rollout_compute", "tp_rank")):
        half = int(rng.integers(1, 4))
        data = make_data(2 * half, rng)
        out = wg.call(method, data)
        assert out.batch["row_id"].tolist() == list(range(2 * half))
        assert out.batch["rank"].tolist() == [0] * half + [2] * half  # only is_collect ranks, rank order
        recs = wg.trace.at(method)
        assert [x.rows for x in recs] == [half] * 4
        assert [x.tokens for x in recs] == [_mask_tokens(data, 0, half)] * 2 + [_mask_tokens(data, half, 2 * half)] * 2
        assert [x.dp_rank for x in recs] == [0, 0, 1, 1] and [getattr(x, coord) for x in recs] == [0, 1, 0, 1]
        assert [x.extra["collected"] for x in recs] == [True, False, True, False]
        with pytest.raises(AssertionError, match=r"^only support equal chunk\. Got size of DataProto 3 and chunk 2\.$"):
            wg.call(method, make_data(3, rng))
    for method, coord in (("legacy_generate", "tp_rank"), ("legacy_sp_compute", "sp_rank")):
        per = int(rng.integers(1, 4))
        data = make_data(4 * per, rng)
        out = wg.call(method, data)
        assert out.batch["row_id"].tolist() == list(range(4 * per))  # sliced back: own rows only
        assert out.batch["rank"].tolist() == [r for r in range(4) for _ in range(per)]
        assert out.batch["seen_rows"].tolist() == [2 * per] * (4 * per)  # B·tp/W rows after the all-gather
        recs = wg.trace.at(method)
        assert [(x.extra["recv_rows"], x.rows, x.extra["out_rows"]) for x in recs] == [(per, 2 * per, per)] * 4
        pair_tokens = [_mask_tokens(data, 0, 2 * per), _mask_tokens(data, 2 * per, 4 * per)]
        assert [x.tokens for x in recs] == [pair_tokens[0]] * 2 + [pair_tokens[1]] * 2
        assert [getattr(x, coord) for x in recs] == [0, 1, 0, 1]
        assert all(x.collectives == {"all_gather(data_proto)": 1} for x in recs)


def check_matches_a_prediction(wg: WorkerGroup, seed: int) -> None:
    """The live trace of an nd-dispatched stage equals the arithmetic prediction (B·n/D rows per rank) via compare."""
    rng = np.random.default_rng(seed)
    data = make_data(8, rng)
    with wg.stage("old_log_prob"):
        wg.actor_compute(data)
    pred = StepTrace(profile="engine", source="plan")
    pred.ranks = [
        RankRecord(
            "old_log_prob",
            r,
            dp_rank=r // 2,
            sp_rank=r % 2,
            rows=4,
            tokens=_mask_tokens(data, 4 * (r // 2), 4 * (r // 2) + 4),
        )
        for r in range(4)
    ]
    pred.stages = list(wg.trace.stages)
    assert compare(pred, wg.trace, stages=["old_log_prob"], fields=("rows", "tokens")) == []
    pred.ranks[3].rows = 5
    assert [str(m) for m in compare(pred, wg.trace, stages=["old_log_prob"], fields=("rows",))] == [
        "old_log_prob rank 3: rows predicted 5, observed 4"
    ]


PLAN_OVERRIDES = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "trainer.n_gpus_per_node=4",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.model.use_remove_padding=true",
    "trainer.balance_batch=false",
]


def check_matches_planner(wg: WorkerGroup, seed: int) -> None:
    """labkit.plan.step's prediction of generate / old_log_prob (B=4, n=2, W=4, sp=2, tp=2) equals what the live ranks
    saw, for mesh dispatch and for the ≤v0.5 all-gather variant: rows, tokens, coordinates, all-gather counts."""
    from labkit.config.verl_config import load_config
    from labkit.plan.step import plan

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 25, size=8).tolist()
    mask = (torch.arange(24)[None, :] < torch.tensor(lengths)[:, None]).long()
    data = DataProto.from_dict(tensors={"row_id": torch.arange(8), "attention_mask": mask})
    cfg = load_config(overrides=PLAN_OVERRIDES, profile="legacy")
    for dispatch, calls in (
        ("mesh", {"generate": "rollout_compute", "old_log_prob": "actor_compute"}),
        ("all_gather", {"generate": "legacy_generate", "old_log_prob": "legacy_sp_compute"}),
    ):
        predicted = plan(cfg, lengths, dispatch=dispatch)
        wg.reset_trace()
        for stage, method in calls.items():
            wg.call(method, data, _stage=stage)
        assert compare(predicted, wg.trace, stages=list(calls), fields=("rows", "tokens")) == []
        for stage in calls:
            coords = [[(r.dp_rank, r.tp_rank, r.sp_rank) for r in t.at(stage)] for t in (predicted, wg.trace)]
            assert coords[0] == coords[1], (dispatch, stage, coords)
        if dispatch == "all_gather":
            assert compare(predicted, wg.trace, stages=["generate"], fields=("collectives",)) == []


# ---- Ray ----------------------------------------------------------------------------------------------------------
@needs_ray
@pytest.mark.slow
def test_ray_group_of_2_starts_and_stops_its_own_ray():
    """Runs first: labkit starts Ray, runs every mode on W=2, a skipped all_reduce fails fast, and Ray goes down."""
    ray = import_ray()
    ray_was_up = ray.is_initialized()  # only when this test is run out of file order
    wg = WorkerGroup(DemoWorker, 2, launcher="ray", collective_timeout_s=COLL_S)
    _CLOSED.append(wg)
    with wg:
        assert wg.launcher == "ray" and ray.is_initialized() and wg.backend == "gloo"
        session = None if ray_was_up else ray_launcher._SESSION_DIR  # the local Ray's folder, removed at the end
        assert ray_was_up or (session and os.path.isdir(session))
        check_modes(wg, seed=2)
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeoutError) as err:
            wg.skip_all_reduce(1)
        assert time.monotonic() - t0 < COLL_S + 5
        assert err.value.rank == 0 and err.value.collective == "all_reduce"
        assert "rank 0" in str(err.value) and "all_reduce" in str(err.value) and "[0, 1]" in str(err.value)
        with pytest.raises(WorkerGroupError, match="unusable"):
            wg.echo(1)
    assert ray.is_initialized() == ray_was_up, "labkit started Ray, so close() must shut it down"
    assert session is None or not os.path.exists(session), f"{session} left behind"


@needs_ray
@pytest.mark.slow
def test_two_ray_groups_share_the_ray_labkit_started():
    """Groups open at once on the Ray labkit started: closing one leaves Ray up for the others (it used to shut Ray
    down under them); a group whose Ray was shut down anyway fails clearly at once, without starting a new Ray."""
    ray = import_ray()
    if ray.is_initialized():
        pytest.skip("a Ray session is already up: this test needs labkit to start its own")
    groups = [WorkerGroup(DemoWorker, 1, launcher="ray", collective_timeout_s=COLL_S) for _ in range(3)]
    _CLOSED.extend(groups)
    a, b, c = groups
    with a, b, c:
        a.close()
        assert ray.is_initialized(), "closing one group shut down the Ray other groups still use"
        assert b.echo(5) == [{"rank": 0, "x": 5}]
        b.close()
        assert ray.is_initialized() and c.echo(6) == [{"rank": 0, "x": 6}]
        ray.shutdown()
        t0 = time.monotonic()
        with pytest.raises(controller.RankDiedError, match="Ray was shut down while this worker group was open"):
            c.echo(1)
        assert time.monotonic() - t0 < 2.0 and not ray.is_initialized()  # no new Ray started behind the user's back
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def ray_session():
    if not ray_available():
        pytest.skip("Ray is not installed here")
    owned = start_ray(num_cpus=4)
    yield
    if owned:
        stop_ray()
        assert not import_ray().is_initialized()


def _ray_session_commands() -> list[str]:
    """Command lines of the processes of the connected Ray session (those that name its session folder)."""
    from labkit.runtime.ray_reaper import session_pids

    session = import_ray()._private.worker.global_worker.node.get_session_dir_path()
    out = []
    for pid in session_pids(session, exclude=(os.getpid(),)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return out


def test_labkit_started_ray_is_lean(ray_session):
    """A Ray labkit starts runs no autoscaler monitor, no log monitor, no dashboard API server, no prestarted idle
    workers (each ~1 CPU-s at start-up on a 2-core machine), and the driver's environment is as it was."""
    from labkit.runtime.ray_init import LEAN_ENV

    commands = _ray_session_commands()
    assert any("raylet" in c for c in commands), commands  # the session is really found
    assert not [c for c in commands if "monitor.py" in c or "dashboard.py" in c or c.startswith("ray::IDLE")], commands
    assert not [k for k in LEAN_ENV if k in os.environ]


@pytest.fixture(scope="module")
def ray_wg4(ray_session):
    wg = WorkerGroup(DemoWorker, 4, launcher="ray", init_kwargs={"sp": 2, "tp": 2}, collective_timeout_s=COLL_S)
    yield wg
    wg.close()
    _assert_clean(wg)


@pytest.mark.slow
def test_ray_group_of_4_modes(ray_wg4):
    assert len(_rank_host_procs()) >= 4
    check_modes(ray_wg4, seed=4)


@pytest.mark.slow
def test_ray_group_of_4_meshes_and_all_gather_variant(ray_wg4):
    check_meshes(ray_wg4, seed=40)
    check_matches_a_prediction(ray_wg4, seed=41)
    check_matches_planner(ray_wg4, seed=42)


@pytest.mark.slow
def test_ray_group_of_1_and_the_driver_watchdog(ray_session):
    """W=1 modes; then a rank wedged in a collective that ignores timeouts is named by the driver's watchdog."""
    wg = WorkerGroup(DemoWorker, 1, launcher="ray", collective_timeout_s=COLL_S)
    _CLOSED.append(wg)
    with wg:
        check_modes(wg, seed=1)
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeoutError, match=r"rank 0 has waited .* in collective all_reduce"):
            wg.stuck_in_collective(0, 60)
        assert COLL_S + controller.GRACE_S <= time.monotonic() - t0 < COLL_S + controller.GRACE_S + 5
    assert import_ray().is_initialized(), "Ray was started by the test, not by labkit: it must stay up"


def test_mesh_errors_come_before_any_process():
    before, n_live = set(_rank_host_procs()), len(live_groups())
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"^rollout world_size: 6 is not divisible by infer_world_size: 4$"):
        WorkerGroup(DemoWorker, 6, launcher="ray", init_kwargs={"tp": 4})
    with pytest.raises(ValueError, match=r"world size 3 is not divisible by ulysses_sequence_parallel_size 2"):
        WorkerGroup(DemoWorker, 3, launcher="ray", init_kwargs={"sp": 2})
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        WorkerGroup(DemoWorker, 0, launcher="ray")
    assert time.monotonic() - t0 < 1.0
    assert set(_rank_host_procs()) <= before and len(live_groups()) == n_live


# ---- local processes (the launcher of machines without Ray) -------------------------------------------------------
@pytest.fixture(scope="module")
def local_wg4():
    wg = WorkerGroup(DemoWorker, 4, launcher="local", init_kwargs={"sp": 2, "tp": 2}, collective_timeout_s=COLL_S)
    yield wg
    wg.close()
    _assert_clean(wg)


@pytest.mark.slow
def test_local_group_of_4_modes_meshes_all_gather(local_wg4):
    assert local_wg4.launcher == "local" and len(set(local_wg4.pids)) == 4
    check_modes(local_wg4, seed=14)
    check_meshes(local_wg4, seed=15)
    check_matches_a_prediction(local_wg4, seed=16)
    check_matches_planner(local_wg4, seed=17)


@pytest.mark.slow
def test_local_group_skipped_collective_fails_fast_then_cleans_up(local_wg4):
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as err:
        local_wg4.skip_all_reduce(2)
    assert time.monotonic() - t0 < COLL_S + 5
    assert err.value.rank == 0 and err.value.collective == "all_reduce" and err.value.others == [1, 3]
    assert "rank 0" in str(err.value) and "--- remote traceback of rank 0 ---" in str(err.value)
    local_wg4.close()
    _assert_clean(local_wg4)


@pytest.mark.slow
def test_local_rank_failing_in_init_is_named_and_everything_is_killed():
    before = set(_descendants())
    t0 = time.monotonic()
    with pytest.raises(RankError) as err:
        WorkerGroup(DemoWorker, 2, launcher="local", init_kwargs={"fail_init_rank": 1}, collective_timeout_s=COLL_S)
    assert err.value.rank == 1 and err.value.method == "__init__"
    assert "told to fail in __init__ on rank 1" in str(err.value)
    assert time.monotonic() - t0 < 120
    leftovers = {p: c for p, c in _descendants().items() if p not in before}
    assert leftovers == {}, f"rank processes left behind: {leftovers}"


def _descendants() -> dict[int, str]:
    """Live descendants of this process, except multiprocessing's helpers (the fork server itself, the resource
    tracker) and Ray's processes; ranks forked by the fork server are its children, so they do count."""
    parent, cmd = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                pass
    out, me = {}, os.getpid()
    for pid in parent:
        p, seen = pid, 0
        while p in parent and p != me and seen < 64:
            p, seen = parent[p], seen + 1
        if p == me and pid != me and pid_alive(pid):
            out[pid] = cmd.get(pid, "")
    helpers = {p for p, c in out.items() if parent[p] == me and ("forkserver" in c or "resource_tracker" in c)}
    ray_own = {p for p, c in out.items() if c.startswith("ray::") or "/ray/" in c}  # the module's Ray session
    return {p: c for p, c in out.items() if p not in helpers | ray_own}


def test_bad_timeouts_and_unimportable_workers_fail_before_any_process(monkeypatch):
    """Timeouts <= 0 / not finite, a bool world size, and a worker class the local ranks could not import (defined
    in a function, or in a notebook's __main__) are clear ValueErrors on the driver, before any process starts."""
    import sys
    import types

    from labkit.runtime.worker import Worker

    before, n_live, t0 = set(_descendants()), len(live_groups()), time.monotonic()
    for kwargs, name in (
        ({"timeout_s": 0}, "timeout_s"),
        ({"collective_timeout_s": -1.0}, "collective_timeout_s"),
        ({"start_timeout_s": float("nan")}, "start_timeout_s"),
        ({"timeout_s": None}, "timeout_s"),
    ):
        with pytest.raises(ValueError, match=f"^{name} must be a finite number of seconds > 0"):
            WorkerGroup(DemoWorker, 2, launcher="local", **kwargs)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        WorkerGroup(DemoWorker, True, launcher="local")

    class LocalWorker(Worker):
        pass

    with pytest.raises(ValueError, match=r"defined inside a function; launcher='local'.*launcher='ray'"):
        WorkerGroup(LocalWorker, 2, launcher="local")
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # a notebook's: no file, no spec
    nb_worker = type("NbWorker", (Worker,), {"__module__": "__main__"})
    with pytest.raises(ValueError, match=r"interactive __main__ \(notebook"):
        WorkerGroup(nb_worker, 2, launcher="local")
    assert time.monotonic() - t0 < 1.0
    assert set(_descendants()) <= before and len(live_groups()) == n_live


@pytest.mark.slow
def test_local_rank_killed_is_reported_at_once_and_a_raw_collective_breaks_the_group():
    """SIGKILL of an idle rank: the next call raises RankDiedError (not BrokenPipeError) within GRACE_S, without
    waiting for the peer's 30 s of work; a raw torch.distributed collective that timed out marks the group unusable."""
    import signal

    wg = WorkerGroup(DemoWorker, 2, launcher="local", collective_timeout_s=1.0, timeout_s=60)
    _CLOSED.append(wg)
    with wg:
        os.kill(wg.pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pid_alive(wg.pids[1]) and time.monotonic() < deadline:  # dead: its pipe end is closed
            time.sleep(0.01)
        t0 = time.monotonic()
        with pytest.raises(controller.RankDiedError, match=r"rank 1 failed in sleep: RankDied: rank 1 .* code -9"):
            wg.sleep(30)
        assert time.monotonic() - t0 < controller.GRACE_S + 3
        with pytest.raises(WorkerGroupError, match="unusable .*died"):
            wg.echo(1)
    wg2 = WorkerGroup(DemoWorker, 2, launcher="local", collective_timeout_s=1.0, timeout_s=60)
    _CLOSED.append(wg2)
    with wg2:
        with pytest.raises(RankError, match="rank 0 failed in raw_skip_all_reduce"):
            wg2.raw_skip_all_reduce(1)
        with pytest.raises(WorkerGroupError, match=r"unusable \(a rank raised inside torch.distributed"):
            wg2.echo(1)


def test_auto_launcher_falls_back_to_local_without_ray(monkeypatch):
    import labkit.runtime.ray_init as rl

    assert controller._pick_launcher("auto") == ("ray" if ray_available() else "local")
    monkeypatch.setattr(rl, "ray_available", lambda: False)
    assert controller._pick_launcher("auto") == "local"
    with pytest.raises(ImportError, match="launcher='ray' but Ray is not installed"):
        controller._pick_launcher("ray")
    with pytest.raises(ValueError, match="launcher must be"):
        controller._pick_launcher("slurm")


# ---- parity with verl 0.9.1's dispatch code (the oracle; no processes) --------------------------------------------
@pytest.fixture(scope="module")
def verl_dispatch():
    decorator = pytest.importorskip("verl.single_controller.base.decorator")
    from verl.protocol import DataProto as VerlDataProto
    from verl.single_controller.base.worker_group import WorkerGroup as VerlWorkerGroup

    return decorator, VerlDataProto, VerlWorkerGroup


class _FakeGroup:
    """What labkit's dispatch functions ask of a worker group."""

    def __init__(self, world_size: int, mapping: list[int] | None = None, mask: list[bool] | None = None) -> None:
        self.world_size, self._mapping, self._mask = world_size, mapping, mask

    def dispatch_info(self, mesh_name: str) -> list[int]:
        return self._mapping

    def collect_info(self, mesh_name: str) -> list[bool]:
        return self._mask


def _pair(n: int, auto_padding: bool, verl_cls):
    ids = torch.arange(n)
    return (
        DataProto.from_dict(tensors={"row_id": ids.clone()}, auto_padding=auto_padding),
        verl_cls.from_dict(tensors={"row_id": ids.clone()}, auto_padding=auto_padding),
    )


def test_parity_dp_compute_proto_chunks_padding_and_e26(verl_dispatch):
    from verl.protocol import _padding_size_key

    from labkit.runtime.dispatch import split_with_auto_padding

    decorator, VerlDataProto, _ = verl_dispatch
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, w, auto = int(rng.integers(1, 40)), int(rng.integers(1, 9)), bool(rng.integers(0, 2))
        mine, theirs = _pair(n, auto, VerlDataProto)
        try:
            v_args, v_kwargs = decorator._split_args_kwargs_data_proto_with_auto_padding(w, theirs)
        except AssertionError as exc:
            with pytest.raises(AssertionError) as err:
                split_with_auto_padding(w, mine)
            assert str(err.value) == str(exc)
            continue
        m_args, _, pad = split_with_auto_padding(w, mine)
        assert [c.batch["row_id"].tolist() for c in m_args[0]] == [c.batch["row_id"].tolist() for c in v_args[0]]
        assert pad == v_kwargs.get(_padding_size_key, 0) and len(mine) == len(theirs)  # both padded in place


def test_parity_nd_dispatch_and_collect(verl_dispatch, monkeypatch):
    import verl.utils.ray_utils as ray_utils

    from labkit.runtime.dispatch import collect_nd_compute_dataproto, dispatch_nd_compute_dataproto

    decorator, VerlDataProto, VerlWorkerGroup = verl_dispatch
    monkeypatch.setattr(ray_utils, "parallel_put", lambda data, max_workers=None: list(data))  # no ray.put here
    rng = np.random.default_rng(1)
    for _ in range(100):
        dp, inner = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        w = dp * inner
        mapping = [r // inner for r in range(w)]  # verl's layouts: TP/SP ranks adjacent
        mask = [r % inner == 0 for r in range(w)]
        n = dp * int(rng.integers(1, 5)) + (int(rng.integers(0, dp)) if rng.random() < 0.3 else 0)
        mine, theirs = _pair(n, False, VerlDataProto)
        vwg = VerlWorkerGroup.__new__(VerlWorkerGroup)
        vwg._workers = [None] * w
        try:
            v_args, _ = decorator.dispatch_nd_compute_dataproto(mapping, dp, vwg, theirs)
        except AssertionError as exc:
            with pytest.raises(AssertionError) as err:
                dispatch_nd_compute_dataproto("m", _FakeGroup(w, mapping, mask), mine)
            assert str(err.value) == str(exc)
            continue
        m_args, _, _ = dispatch_nd_compute_dataproto("m", _FakeGroup(w, mapping, mask), mine)
        assert [c.batch["row_id"].tolist() for c in m_args[0]] == [c.batch["row_id"].tolist() for c in v_args[0]]
        v_out = decorator.collect_nd_compute_dataproto(mask, vwg, list(v_args[0]))
        m_out = collect_nd_compute_dataproto("m", _FakeGroup(w, mapping, mask), list(m_args[0]))
        assert m_out.batch["row_id"].tolist() == v_out.batch["row_id"].tolist()


def test_parity_execute_all_splits_per_rank_lists_only(verl_dispatch):
    from verl.single_controller.ray.base import RayWorkerGroup

    from labkit.runtime.dispatch import split_for_ranks

    class Recorder(RayWorkerGroup):
        def _execute_remote_single_worker(self, worker, method_name, *args, **kwargs):
            return worker, args, kwargs

    rng = np.random.default_rng(2)
    for _ in range(200):
        w = int(rng.integers(1, 5))
        pool = [
            lambda: [f"l{i}" for i in range(w)],
            lambda: [1] * (w + 1),
            lambda: (0,) * w,
            lambda: 5,
            lambda: None,
            lambda: [],
        ]
        args = tuple(pool[int(rng.integers(0, len(pool)))]() for _ in range(int(rng.integers(0, 3))))
        kwargs = {f"k{j}": pool[int(rng.integers(0, len(pool)))]() for j in range(int(rng.integers(0, 3)))}
        rec = Recorder.__new__(Recorder)
        rec._workers = list(range(w))
        theirs = rec.execute_all_async("m", *args, **kwargs)
        m_args, m_kwargs = split_for_ranks(w, args, kwargs)
        assert [(a, k) for _, a, k in theirs] == list(zip(m_args, m_kwargs))
