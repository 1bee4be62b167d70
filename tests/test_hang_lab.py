"""The hang lab on real ranks: each of verl's four batch-size hangs ends by its collective timeout, is diagnosed rank by
rank (rank, stage, collective, call, counts), leaves no process behind, and the fixed run completes with the
planner's collective counts. A timeout anywhere else in a live run carries the same per-rank report."""

from __future__ import annotations

import time

import pytest
from _procs import spawned_processes

from labkit.hangs import reproduce
from labkit.plan.hang_risk import unsynced_counts

TIMEOUT_S = 2.0
pytestmark = pytest.mark.slow


def _run(scenario: str) -> reproduce.HangRun:
    before = spawned_processes()
    t0 = time.monotonic()
    run = reproduce.SCENARIOS[scenario](timeout_s=TIMEOUT_S)
    assert time.monotonic() - t0 < 60, "a reproduction and its fix must end within a minute"
    assert run.left_pids == [], f"rank processes left behind: {run.left_pids}"
    left = spawned_processes() - before
    assert not left, f"processes left behind: {left}"
    assert run.fixed is not None and run.fixed.completed, [r["error"] for r in run.fixed.results]
    assert run.fixed.mismatches == [], run.fixed.mismatches  # the fixed run issues what the planner predicts
    assert run.fixed.observed and all(run.fixed.observed.values())
    return run


def _waited(run: reproduce.HangRun, rank: int):
    state = run.diagnosis.ranks[rank]
    assert state.outcome == "timeout", state
    assert TIMEOUT_S - 0.2 <= state.waited_s < TIMEOUT_S + 2.0, state.waited_s  # ended by the collective timeout
    assert any(e["outcome"] == "timeout" and e["rank"] == rank for e in run.events)  # on the timeline too
    return state


def test_a_unsynced_dynamic_bsz_the_heavy_rank_waits_for_a_second_all_gather():
    run = _run("a")
    d = run.diagnosis
    assert (d.scenario, d.rank, d.stage, d.collective) == ("a", 0, "old_log_prob", "all_gather(params)")
    heavy = _waited(run, 0)
    assert (heavy.call, heavy.micro_batch) == (2, 1)  # its second all-gather, micro-batch 1, has no partner
    assert any("micro_batch_stage" in line for line in heavy.stack), heavy.stack  # the Python stack of the wait
    assert d.ranks[1].outcome == "ok" and d.ranks[1].issued == {"all_gather(params)": 1}
    assert "all_gather(params): rank 0 2, rank 1 1" in d.mismatch
    assert unsynced_counts([reproduce.HEAVY, reproduce.LIGHT], reproduce.BUDGET, "legacy", 4096) == [3, 1]
    assert "PR #5591" in d.fix
    # with the MAX sync both ranks run 3 micro-batches: 3 all-gathers each, as the planner says
    assert {r: c["all_gather(params)"] for r, c in run.fixed.observed.items()} == {0: 3, 1: 3}


def test_b_light_rank_asserts_after_the_max_sync_and_its_peer_waits():
    run = _run("b")
    d = run.diagnosis
    assert (d.rank, d.stage, d.collective) == (0, "old_log_prob", "all_gather(params)")
    peer = _waited(run, 0)
    assert (peer.call, peer.micro_batch) == (1, 0)
    light = d.ranks[1]
    assert light.outcome == "raised" and light.error.startswith("AssertionError")
    assert light.issued == {"all_reduce(max):num_micro_batches": 1}  # the sync itself succeeded
    assert "synced k = 3, rows per rank [4, 2]" in d.mismatch
    assert [r["dummies"] for r in run.fixed.results] == [0, 1]  # the fork's fix: one dummy micro-batch on rank 1


def test_c_split_zero_loops_with_memory_climbing_until_the_lab_stops_it():
    run = _run("c")
    d = run.diagnosis
    assert d.rank == 0 and d.collective is None and d.stage == "old_log_prob"
    assert all(r["outcome"] == "looping" for r in run.results)
    assert all(r["micro_batches"] > 1000 and r["counts"] == {} for r in run.results)  # empty pieces, no collective
    assert all(r["rss_growth_bytes"] > 0 for r in run.results), [r["rss_growth_bytes"] for r in run.results]
    assert "micro size 0 per GPU" in d.mismatch and "_per_gpu" in d.fix
    assert {r: c for r, c in run.fixed.observed.items()} == {0: {"all_gather(params)": 2}, 1: {"all_gather(params)": 2}}


def test_d_tp_all_gather_with_unequal_rows_waits_for_the_missing_row():
    run = _run("d")
    d = run.diagnosis
    assert (d.rank, d.stage, d.collective) == (0, "generate", "all_gather(data_proto)")
    assert _waited(run, 0).call == 2
    assert d.ranks[1].outcome == "ok" and d.ranks[1].issued == {"all_gather(data_proto)": 1}
    assert "rows per rank [2, 1]" in d.mismatch and "pad_dataproto_to_divisor" in d.fix
    assert run.fixed.observed == {0: {"all_gather(data_proto)": 1}, 1: {"all_gather(data_proto)": 1}}


def test_any_live_collective_timeout_carries_the_per_rank_report():
    """Outside the lab too: the rank that times out reports stage, collective, call count and its Python stack in
    the error the driver raises."""
    from labkit.runtime.demo_worker import DemoWorker
    from labkit.runtime.rank_errors import CollectiveTimeoutError, RankError
    from labkit.runtime.worker_group import WorkerGroup

    with WorkerGroup(DemoWorker, 3, launcher="local", collective_timeout_s=TIMEOUT_S) as wg:
        with pytest.raises(CollectiveTimeoutError) as err:
            wg.skip_all_reduce(2)
    text = str(err.value)
    for rank in (0, 1):  # both ranks that waited report, not only the root cause's
        report = text.split(f"--- hang report of rank {rank} ", 1)[1].split("\n--- ", 1)[0]
        assert "waiting in all_reduce (call #1) over ranks [0, 1, 2]" in report
        assert "skip_all_reduce" in report.split("Python stack (innermost last):", 1)[1]
    assert "hang report of rank 2" not in text  # it skipped the collective: it never waited
    assert wg.alive_pids() == []
    # a collective torch runs itself (not labkit's guarded one) is named from the exception's own stack
    with WorkerGroup(DemoWorker, 2, launcher="local", collective_timeout_s=TIMEOUT_S) as raw:
        with pytest.raises(RankError) as err:
            raw.raw_skip_all_reduce(1)
    report = str(err.value).split("--- hang report of rank 0 ", 1)[1]
    assert "failed in torch.distributed.all_reduce" in report and "raw_skip_all_reduce" in report


def test_a_on_the_fsdp2_actor_the_heavy_rank_fails_in_fsdps_all_gather():
    """The same hang on the training actor (FSDP2 shards of a tiny Qwen2, verl 0.7.1's skipped sync): rank 0's second
    forward fails in torch's own all-gather after the timeout and reports stage, micro-batch and the torch call."""
    from labkit.hangs.fsdp import fsdp_unsynced_dynamic_bsz

    before = spawned_processes()
    run = fsdp_unsynced_dynamic_bsz(timeout_s=TIMEOUT_S)
    assert run.left_pids == [] and not (spawned_processes() - before)
    d = run.diagnosis
    assert (d.rank, d.stage, d.collective) == (0, "old_log_prob", "all_gather(params)")
    heavy = d.ranks[0]
    assert heavy.outcome == "timeout" and (heavy.call, heavy.micro_batch) == (2, 1)
    assert run.results[0]["report"]["stage"] == "old_log_prob"
    assert "all_gather" in run.results[0]["error"] or "Timed out" in run.results[0]["error"]
    assert any("labkit/rl/actor.py" in line for line in heavy.stack)  # the stack reaches the actor's forward
    assert d.ranks[1].outcome == "ok" and d.ranks[1].issued == {"all_gather(params)": 1}
    assert run.fixed.completed and run.fixed.mismatches == []  # with the sync: 4 forwards each, as the plan says
    assert {r: c["all_gather(params)"] for r, c in run.fixed.observed.items()} == {0: 4, 1: 4}
