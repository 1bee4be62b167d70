"""The live Megatron-style pipeline on CPU ranks: its model chunks equal the tiny Qwen2, the activation meter counts
what autograd keeps, and on three layouts (PP=2×DP=2, PP=4, PP=2×VPP=2×DP=2) the live step equals the plan: order of
forwards and backwards per stage, micro-batches in flight, activation bytes per stage, P2P and DP collectives; its
loss and grad norm equal one process's. The two pipeline hangs end by their timeout, name rank, stage and collective,
and leave no process behind."""

from __future__ import annotations

import math
import time

import pytest
import torch
from _procs import spawned_processes

from labkit.hangs import pipeline_hang
from labkit.model.pipeline_model import (
    SavedActivations,
    check_pipeline_split,
    chunk_activation_bytes,
    chunk_specs,
    pipeline_chunks,
)
from labkit.model.pipeline_worker import micro_batch_ids, pipeline_layout
from labkit.plan.pipeline_schedule import pipeline_schedule
from labkit.trace import compare
from labkit.trainer import pipeline_live as pl
from labkit.ui import pipeline_figures as pf
from labkit.ui.figure_style import validated

LAYOUTS = [(2, None, 2), (4, None, 1), (2, 2, 2)]
M, ROWS, SEQ = 4, 2, 32
TIMEOUT_S = 2.0


def test_chunks_chained_equal_the_tiny_qwen2():
    from labkit.model.tiny_model import load_tiny_model

    ids = torch.randint(0, 320, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = load_tiny_model()(ids).logits
        x = ids
        for chunk in pipeline_chunks(3, 1, None):
            x = chunk(x)
    torch.testing.assert_close(x, ref, rtol=1e-5, atol=1e-5)


def test_chunk_split_follows_megatron_core():
    specs = chunk_specs(4, 2, 2)
    assert [(s.virtual_stage, s.stage, s.chunk, s.layers) for s in specs] == [
        (0, 0, 0, (0,)), (1, 1, 0, (1,)), (2, 0, 1, (2,)), (3, 1, 1, (3,))
    ]  # fmt: skip
    assert specs[0].first and specs[-1].last and not specs[1].last
    with pytest.raises(ValueError, match="^num_layers should be divisible by pipeline_model_parallel_size$"):
        check_pipeline_split(3, 2, None)
    with pytest.raises(ValueError, match=r"^num_layers_per_pipeline_rank 1 {13}should be divisible by vp_size 2$"):
        check_pipeline_split(4, 4, 2)


def test_saved_activations_are_freed_by_the_backward():
    chunk = pipeline_chunks(4, 2, None, stage=1)[0]
    meter = SavedActivations(chunk.parameters())
    x = torch.randn(2, 8, 256, requires_grad=True)
    labels = torch.randint(0, 320, (2, 8))
    losses = []
    for mb in range(2):
        with meter.record((mb, 0)):
            losses.append(chunk(x * 1.0, labels))
    one = meter.by_tag[(0, 0)]
    assert meter.in_flight == 2 and meter.live == meter.peak == 2 * one - (one - meter.by_tag[(1, 0)])
    assert one > 2 * 8 * 256 * 4  # more than the input: every layer's saved tensors
    losses[0].backward()
    assert meter.in_flight == 1 and (0, 0) not in meter.by_tag
    losses[1].backward()
    assert meter.live == 0 and meter.in_flight == 0 and meter.peak > 0


def test_prediction_counts_follow_the_schedule():
    for pp, vpp, dp in LAYOUTS:
        sched = pipeline_schedule(pp, vpp, M)
        units = chunk_activation_bytes(pl.NUM_LAYERS, pp, vpp, ROWS, SEQ)
        assert len(units) == pp * (vpp or 1) and all(u > 0 for u in units)
        for st in sched.stages:
            counts, held = pl.predicted_held(st.actions, units, pp, st.stage)
            assert max(counts) == st.peak_in_flight and counts[-1] == 0 and held[-1] == 0
        layout = pipeline_layout(pp, vpp, dp)
        first = pl.predicted_counts(sched, layout, 0)
        assert first["send(pp):activation"] == M * (vpp or 1) and "recv(pp):grad" in first
        assert ("all_reduce(dp_cp):grads" in first) == (dp > 1)
    with pytest.raises(ValueError, match="pipeline_model_parallel_size >= 2"):
        pl.pipeline_spec(1)
    with pytest.raises(ValueError, match="one positive count per DP rank"):
        pl.pipeline_spec(2, None, 2, [3])


def test_hang_counts_without_and_with_the_max_sync():
    assert pipeline_hang.dynamic_counts(False) == [3, 2]
    assert pipeline_hang.dynamic_counts(True) == [3, 3]
    assert pipeline_hang.dynamic_counts(False, group=2) == [4, 2]  # VPP rounds each rank up to G alone


def _reference(pp: int, vpp: int | None, dp: int) -> tuple[list[float], float]:
    """One process: each DP rank's loss (mean over its micro-batches) and the norm of the DP-averaged gradient."""
    chunks = pipeline_chunks(pl.NUM_LAYERS, pp, vpp)
    params = [p for c in chunks for p in c.parameters()]
    losses, grads = [], None
    for d in range(dp):
        for p in params:
            p.grad = None
        total = 0.0
        for mb in range(M):
            ids = micro_batch_ids(0, d, mb, ROWS, SEQ)
            x = ids
            for c in chunks:
                x = c(x, ids if c.spec.last else None)
            (x / M).backward()
            total += float(x.detach()) / M
        losses.append(total)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        grads = flat if grads is None else grads + flat
    return losses, float((grads / dp).double().norm())  # float32's norm of 3M elements is off by ~3e-4


@pytest.fixture(scope="module")
def group():
    before = spawned_processes()
    wg = pl.open_group(4, 10.0)
    yield wg
    wg.close()
    assert wg.alive_pids() == []
    assert not spawned_processes() - before


@pytest.mark.slow
@pytest.mark.parametrize("pp,vpp,dp", LAYOUTS, ids=["pp2-dp2", "pp4", "pp2-vpp2-dp2"])
def test_live_step_equals_the_plan(group, pp, vpp, dp):
    run = pl.live_pipeline(pp, vpp, dp, M, ROWS, SEQ, group=group)
    assert run.mismatches() == []
    planned, live = run.traces()  # the lab's one record type: the counts held by labkit.trace.compare
    assert compare(planned, live, fields=("rows", "tokens", "n_micro", "micro_rows", "collectives")) == []
    assert [r.extra["actions"] for r in live.ranks] == [r.extra["actions"] for r in planned.ranks]
    assert all(abs(r.bytes_measured / r.bytes_predicted - 1) <= pl.BYTES_TOLERANCE for r in live.ranks)
    for s in run.stages:  # the order, the in-flight count after every action, the bytes within the tolerance
        assert s.observed_actions == s.predicted_actions and s.observed_in_flight == s.predicted_in_flight
        assert abs(s.bytes_ratio - 1) <= pl.BYTES_TOLERANCE, s.bytes_ratio
        assert s.observed_bytes == s.predicted_bytes  # after every action, not only at the peak
        assert s.observed_bytes[-1] == 0  # every saved tensor freed by its backward
    peaks = {s.stage: s.observed_peak_bytes for s in run.stages if s.dp_rank == 0}
    assert peaks[0] == max(peaks.values()) and peaks[0] > peaks[pp - 1]  # the first stage holds the most
    if vpp is None:
        assert [max(s.observed_in_flight) for s in run.stages if s.dp_rank == 0] == [min(pp - r, M) for r in range(pp)]
    losses, norm = _reference(pp, vpp, dp)
    last = sorted((r for r in run.results if r["pp_stage"] == pp - 1), key=lambda r: r["dp_rank"])
    assert [r["loss"] for r in last] == pytest.approx(losses, rel=1e-5)
    assert all(math.isclose(r["grad_norm"], norm, rel_tol=1e-6) for r in run.results), (
        norm,
        run.results[0]["grad_norm"],
    )
    if vpp:  # the figures of a live run survive plotly's validation (once: it costs seconds)
        for fig in (pf.observed_timeline(run), pf.activations_over_step(run), pf.peak_per_stage(run)):
            validated(fig)


@pytest.mark.slow
def test_hang_a_unsynced_dynamic_bsz_waits_in_the_expert_all_to_all(group):
    before = spawned_processes()
    t0 = time.monotonic()
    run = pipeline_hang.unsynced_dynamic_bsz(TIMEOUT_S, group=group)
    assert time.monotonic() - t0 < 45
    d = run.diagnosis
    assert (d.rank, d.collective) == (0, "all_to_all(ep):tokens:backward") and "pipeline stage 0" in d.stage
    heavy = d.ranks[0]
    assert heavy.outcome == "timeout" and TIMEOUT_S - 0.2 <= heavy.waited_s < TIMEOUT_S + 2.0
    assert heavy.issued["all_to_all(ep):tokens"] == 3 and d.ranks[1].issued["all_to_all(ep):tokens"] == 2
    assert d.ranks[1].waiting_in == "all_reduce(dp_cp):grads"  # the light DP rank finished and waits for its peer
    assert "all_to_all(ep):tokens: rank 0 3, rank 1 2, rank 2 3, rank 3 2" in d.mismatch
    assert run.left_pids == [] and not spawned_processes() - before
    assert run.fixed_completed and run.fixed_mismatches == []


@pytest.mark.slow
def test_hang_b_vpp_assert_on_one_dp_rank_leaves_its_peers_in_the_gradient_reduce(group):
    before = spawned_processes()
    run = pipeline_hang.vpp_light_rank(TIMEOUT_S, group=group)
    d = run.diagnosis
    assert (d.rank, d.collective) == (0, "all_reduce(dp_cp):grads") and "pipeline stage 0" in d.stage
    assert [s.outcome for s in d.ranks] == ["timeout", "raised", "timeout", "raised"]
    light = d.ranks[1]
    assert light.error.startswith("AssertionError: micro_batches [3 micro-batches] must be divisible by"), light.error
    assert light.issued == {}
    assert run.left_pids == [] and not spawned_processes() - before
    assert run.fixed_completed and run.fixed_mismatches == []


def test_panel_redraws_without_touching_the_config():
    from labkit.config.text_input import load_pasted_config
    from labkit.model.tiny_model import REPO_ROOT
    from labkit.ui.pipeline_panel import megatron_panel

    script = REPO_ROOT / "tests/data/launch_scripts/verl-1dda039/examples/grpo_trainer/run_qwen3_8b_megatron.sh"
    cfg = load_pasted_config(script.read_text())[0]
    before = dict(cfg.values)
    panel = megatron_panel(cfg, "long-reasoning")
    assert "D = W/(TP·PP·CP) = 2" in panel.card.value and panel.figure_area.showing == "figures"
    panel.boxes["PP"].value = 4
    assert "D = W/(TP·PP·CP) = 1" in panel.card.value and "without_interleaving" in panel.card.value
    panel.boxes["VPP (0: none)"].value = 2
    assert "with_interleaving" in panel.card.value and len(panel.figure_area.last) == 3
    for fig in panel.figure_area.last:
        validated(fig)
    panel.boxes["PP"].value = 3
    assert panel.figure_area.showing == "nothing" and "world_size (8) is not divisible by 6" in panel.card.value
    assert cfg.values == before  # every redraw plans a copy
