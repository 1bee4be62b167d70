"""labkit.runtime.dist: verl's mesh layouts, guarded collectives, the DataProto all-gather, timeouts and teardown.

One start of 4 real gloo ranks runs every in-rank check and sends plain Python results back (never tensors)."""

from __future__ import annotations

import os
import socket
import time
import traceback

import pytest
import torch

from labkit.runtime import dist, meshes, process_group

WORLD = 4
COLLECTIVE_TIMEOUT_S = 3.0


# ---- driver-side checks (no processes) ----------------------------------------------------------------------------
@pytest.mark.parametrize("world,tp,rdp,pp", [(5, 2, 1, 1), (6, 4, 1, 1), (6, 2, 2, 1), (4, 1, 1, 3), (7, 7, 1, 2)])
def test_rollout_mesh_check_is_verl_e23(world, tp, rdp, pp):
    with pytest.raises(AssertionError) as err:
        meshes.check_rollout_mesh(world, tp, rdp, pp)
    assert str(err.value) == f"rollout world_size: {world} is not divisible by infer_world_size: {tp * rdp * pp}"


@pytest.mark.parametrize("world,tp,rdp,pp", [(4, 2, 1, 1), (6, 2, 1, 1), (8, 2, 2, 2), (3, 1, 1, 1), (6, 3, 2, 1)])
def test_rollout_mesh_check_accepts_divisible(world, tp, rdp, pp):
    meshes.check_rollout_mesh(world, tp, rdp, pp)


def test_actor_mesh_check_names_both_numbers():
    with pytest.raises(ValueError, match=r"world size 6 is not divisible by ulysses_sequence_parallel_size 4"):
        meshes.check_actor_mesh(6, 4)
    meshes.check_actor_mesh(6, 3)


def test_backend_choice_on_this_machine():
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    expected = ("nccl", "cuda") if n_gpu >= 4 else ("gloo", "cuda" if n_gpu else "cpu")
    assert process_group.choose_backend(4) == expected
    assert process_group.choose_backend(4, "gloo") == ("gloo", "cpu")
    if n_gpu < 4:
        with pytest.raises(ValueError, match="nccl needs one GPU per rank"):
            process_group.choose_backend(4, "nccl")
    with pytest.raises(ValueError, match="backend must be"):
        process_group.choose_backend(2, "mpi")


def test_bad_timeouts_are_clear_errors_before_any_wait():
    """gloo reads a timeout of 0 as "no timeout" and fails every collective of a group with timeout 0 at once:
    timeouts <= 0 or not finite are ValueErrors, raised before any rendezvous, collective or process."""
    from labkit.model import ulysses_demo

    for bad in (0, -1.0, float("inf"), float("nan"), None):
        with pytest.raises(ValueError, match=r"^timeout_s must be a finite number of seconds > 0"):
            process_group.init_dist(0, 1, process_group.free_port(), timeout_s=bad)
    with pytest.raises(ValueError, match=r"^rendezvous_timeout_s must be a finite number of seconds > 0"):
        process_group.init_dist(0, 1, process_group.free_port(), rendezvous_timeout_s=0)
    with pytest.raises(ValueError, match=r"need 0 <= rank < world_size"):
        process_group.init_dist(2, 2, process_group.free_port())
    with pytest.raises(ValueError, match=r"^timeout_s must be a finite number of seconds > 0"):
        dist.all_reduce(torch.ones(1), timeout_s=0)
    with pytest.raises(ValueError, match=r"^timeout_s must be a finite number of seconds > 0"):
        ulysses_demo.spawn_ranks(ulysses_demo.sp_rank_main, 2, {}, timeout_s=0)
    with pytest.raises(ValueError, match=r"^timeout_s must be a finite number of seconds > 0"):
        ulysses_demo.run_sp_demo({}, sp=2, timeout_s=-1)
    assert not torch.distributed.is_initialized()


def test_free_port_is_bindable():
    port = process_group.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# ---- in-rank checks (4 spawned gloo ranks) ------------------------------------------------------------------------
def _rank_main(rank: int, port: int, queue) -> None:
    """Runs in a spawned rank: every check appends plain data to `out`, sent back through the queue."""
    torch.set_num_threads(1)
    out: dict = {"rank": rank}
    try:
        from labkit.protocol.data_proto import DataProto

        process_group.init_dist(rank, WORLD, port, timeout_s=COLLECTIVE_TIMEOUT_S, rendezvous_timeout_s=120)
        am = meshes.actor_mesh(sp=2)
        out["actor"] = (
            meshes.dp_rank(am),
            meshes.sp_rank(am),
            meshes.group_ranks(am.get_group("dp")),
            meshes.group_ranks(am.get_group("sp")),
        )
        rm = meshes.rollout_mesh(tp=2)
        out["rollout_tp2"] = (
            meshes.dp_rank(rm),
            meshes.tp_rank(rm),
            meshes.group_ranks(rm.get_group("infer_tp")),
            meshes.group_ranks(rm.get_group("dp")),
        )
        rm2 = meshes.rollout_mesh(tp=2, pp=2)
        out["rollout_tp2_pp2"] = (
            rm2.get_local_rank("dp"),
            rm2.get_local_rank("infer_tp"),
            rm2.get_local_rank("infer_pp"),
            meshes.group_ranks(rm2.get_group("infer_tp")),
            meshes.group_ranks(rm2.get_group("infer_pp")),
        )
        out["mesh_ranks"] = {
            "local_rank": rm.get_local_rank("infer_tp"),
            "size": rm.size(rm.mesh_dim_names.index("infer_tp")),
        }
        out["sum"] = dist.all_reduce(torch.tensor([float(rank + 1)])).item()
        out["max"] = dist.all_reduce(torch.tensor([float(rank)]), op="max").item()
        out["avg_sp"] = dist.all_reduce(torch.tensor([float(rank)]), op="avg", group=am.get_group("sp")).item()
        out["gather"] = [t.tolist() for t in dist.all_gather(torch.tensor([rank, 10 * rank]))]
        out["objects"] = dist.all_gather_object({"r": rank, "s": "x" * rank}, group=am.get_group("dp"))
        dist.barrier()
        data = DataProto.from_dict(
            tensors={
                "ids": torch.tensor([[2 * rank, 0], [2 * rank + 1, 1]]),
                "attention_mask": torch.ones(2, 2, dtype=torch.long) * (rank + 1),
            },
            non_tensors={"uid": [f"u{rank}a", f"u{rank}b"]},
            meta_info={"temperature": 1.0},
        )
        gathered = dist.all_gather_data_proto(data, group=rm.get_group("infer_tp"))
        out["gathered"] = (
            gathered.batch["ids"].tolist(),
            gathered.batch["attention_mask"][:, 0].tolist(),
            list(gathered.non_tensor_batch["uid"]),
            gathered.meta_info,
        )
        out["counts"] = dist.collective_counts()
        out["inflight_idle"] = dist.inflight()
        # rank 3 never enters this all_reduce: the others must raise within the timeout, naming rank and collective
        if rank == WORLD - 1:
            time.sleep(COLLECTIVE_TIMEOUT_S + 2.0)
        else:
            t0 = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1))
                out["timeout"] = None
            except dist.CollectiveTimeout as exc:
                out["timeout"] = (str(exc), exc.rank, exc.collective, exc.group_ranks, time.monotonic() - t0)
        out["destroyed"] = process_group.teardown()
        out["initialized_after"] = torch.distributed.is_initialized()
    except BaseException:
        out["error"] = traceback.format_exc()
    queue.put(out)


@pytest.fixture(scope="module")
def rank_results():
    import torch.multiprocessing as mp

    from labkit.runtime.local_launcher import FORKSERVER_PRELOAD

    ctx = mp.get_context("forkserver")  # as labkit's local launcher: one preloaded server forks the ranks
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    queue = ctx.SimpleQueue()
    port = process_group.free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, queue), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + 240
    try:
        while len(results) < WORLD and time.monotonic() < deadline:
            if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs):
                break
            if not queue.empty():
                got = queue.get()
                results[got["rank"]] = got
            else:
                time.sleep(0.05)
        for p in procs:
            p.join(20)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    assert all(not p.is_alive() for p in procs), "a rank process outlived the test"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    assert sorted(results) == list(range(WORLD)), f"missing ranks: {set(range(WORLD)) - set(results)}"
    for r in results.values():
        assert "error" not in r, r["error"]
    return results


@pytest.mark.slow
def test_actor_mesh_is_verl_layout(rank_results):
    # (dp, sp) = (W/sp, sp): rank r -> dp r // sp, sp r % sp; SP groups [[0,1],[2,3]], DP groups [[0,2],[1,3]]
    for r, res in rank_results.items():
        dp, sp, dp_group, sp_group = res["actor"]
        assert (dp, sp) == (r // 2, r % 2)
        assert sp_group == [2 * (r // 2), 2 * (r // 2) + 1]
        assert dp_group == [r % 2, r % 2 + 2]


@pytest.mark.slow
def test_rollout_mesh_is_verl_layout(rank_results):
    # (dp, infer_tp, infer_pp): rank = dp*(tp*pp) + tp_idx*pp + pp_idx; tp=2 pairs are [[0,1],[2,3]]
    for r, res in rank_results.items():
        dp, tp, tp_group, dp_group = res["rollout_tp2"]
        assert (dp, tp) == (r // 2, r % 2) and tp_group == [2 * (r // 2), 2 * (r // 2) + 1]
        assert dp_group == [r % 2, r % 2 + 2]
        assert res["mesh_ranks"] == {"local_rank": r % 2, "size": 2}
        dp, tp, pp, tp_group, pp_group = res["rollout_tp2_pp2"]
        assert (dp, tp, pp) == (0, r // 2, r % 2)
        assert tp_group == [r % 2, r % 2 + 2] and pp_group == [2 * (r // 2), 2 * (r // 2) + 1]


@pytest.mark.slow
def test_guarded_collectives_compute_right(rank_results):
    for r, res in rank_results.items():
        assert res["sum"] == sum(range(1, WORLD + 1))
        assert res["max"] == WORLD - 1
        assert res["avg_sp"] == (2 * (r // 2) + 2 * (r // 2) + 1) / 2
        assert res["gather"] == [[q, 10 * q] for q in range(WORLD)]
        assert res["objects"] == [{"r": q, "s": "x" * q} for q in (r % 2, r % 2 + 2)]
        assert res["inflight_idle"] is None


@pytest.mark.slow
def test_all_gather_data_proto_concatenates_in_group_order(rank_results):
    for r, res in rank_results.items():
        ids, mask_values, uids, meta = res["gathered"]
        pair = [2 * (r // 2), 2 * (r // 2) + 1]
        assert ids == [[2 * q + i, i] for q in pair for i in (0, 1)]
        assert mask_values == [q + 1 for q in pair for _ in (0, 1)]
        assert uids == [f"u{q}{c}" for q in pair for c in "ab"]
        assert meta == {"temperature": 1.0}


@pytest.mark.slow
def test_collective_counts_are_recorded(rank_results):
    for res in rank_results.values():
        counts = res["counts"]
        # the DataProto all-gather counts once under the planner's name, not as its inner collectives
        assert counts == {
            "all_reduce": 3,
            "barrier": 1,
            "all_gather": 1,
            "all_gather_object": 1,
            "all_gather(data_proto)": 1,
        }


@pytest.mark.slow
def test_skipped_collective_raises_naming_rank_and_collective(rank_results):
    for r in range(WORLD - 1):
        text, rank, name, group, elapsed = rank_results[r]["timeout"]
        assert (rank, name, group) == (r, "all_reduce", list(range(WORLD)))
        assert f"rank {r}" in text and "all_reduce" in text
        assert COLLECTIVE_TIMEOUT_S - 0.2 <= elapsed < COLLECTIVE_TIMEOUT_S + 3.0


@pytest.mark.slow
def test_teardown_destroys_the_process_group(rank_results):
    for res in rank_results.values():
        assert res["destroyed"] is True and res["initialized_after"] is False


def test_driver_process_never_joined_a_group():
    assert not torch.distributed.is_initialized()
    assert process_group.state() is None and os.environ.get("RANK") is None
