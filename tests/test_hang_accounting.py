"""Collective accounting, prediction == observation: the rollout's TP collectives in generate (all-reduces per layer
and step, logit broadcasts, fingerprints) and the hang lab's dynamic stages (DP MAX sync, FSDP all-gathers and
reduce-scatters, the engine's token sum and metric collectives) on several configs, live on 2 ranks against the
planner. (The training actor's own counts against the planner: tests/test_actor.py::test_trace_matches_plan.)"""

from __future__ import annotations

import pytest

from labkit.config.keys import ARR
from labkit.hangs.accounting import add_tp_prediction
from labkit.hangs.reproduce import BUDGET, HEAVY, LIGHT, dynamic_config, fixed_dynamic_run
from labkit.rules.collectives import COLLECTIVES, tp_generate_collectives
from labkit.trace import compare

pytestmark = pytest.mark.slow


def test_tp_generate_formula():
    assert tp_generate_collectives(2, 7, 1) == {}
    assert tp_generate_collectives(2, 7, 2) == {
        "all_gather(tp):fingerprint": 2,
        "all_reduce(tp)": 28,
        "broadcast(tp):logits": 7,
    }
    assert set(tp_generate_collectives(3, 1, 4)) <= set(COLLECTIVES)


def test_rollout_tp_collectives_match_the_prediction():
    """W=2, TP=2, both dispatch variants: every rank's generate collectives equal the planner's plus the TP counts
    predicted from its replica's longest response; a wrong layer count is caught."""
    from labkit.trainer.live_rollout import LiveRollout

    cfg = [
        "trainer.n_gpus_per_node=2",
        f"{ARR}.rollout.tensor_model_parallel_size=2",
        "data.train_batch_size=2",
        f"{ARR}.rollout.n=2",
        "data.max_response_length=8",
        f"{ARR}.rollout.name=hf",  # labkit's TP collectives are the HF engine's
    ]
    with LiveRollout(cfg, launcher="local", collective_timeout_s=30.0) as live:
        layers = live.wg.model_info()["config"]["num_hidden_layers"]
        batch = live.batch(seed=3)
        for dispatch in ("mesh", "all_gather"):
            out, trace = live.run(batch, dispatch=dispatch, seed=1)
            pred = add_tp_prediction(live.predict(batch, dispatch), out, layers, 2)
            assert compare(pred, trace, stages=["generate"], fields=("collectives",)) == []
            observed = [r.collectives for r in trace.at("generate")]
            assert all(c["all_reduce(tp)"] > 0 and c["all_gather(tp):fingerprint"] == 2 for c in observed)
            assert (dispatch == "all_gather") == all(c.get("all_gather(data_proto)") == 1 for c in observed)
            wrong = add_tp_prediction(live.predict(batch, dispatch), out, layers + 1, 2)
            assert compare(wrong, trace, stages=["generate"], fields=("collectives",)) != []
    assert live.wg.alive_pids() == []


ACTOR_DYNAMIC = (f"{ARR}.actor.use_dynamic_bsz=true", f"{ARR}.actor.ppo_max_token_len_per_gpu={BUDGET}")


@pytest.mark.parametrize(
    "profile,update,lengths",
    [
        ("legacy", False, HEAVY + LIGHT),
        ("legacy", True, HEAVY + LIGHT),
        ("engine", False, LIGHT + HEAVY),
        ("engine", True, HEAVY + LIGHT),  # hard cap: 3 buckets do not fit rank 0's 12000 tokens, 4 do
    ],
)
def test_lab_stage_collectives_match_the_plan(profile, update, lengths):
    run = fixed_dynamic_run(dynamic_config(profile, BUDGET, *ACTOR_DYNAMIC), lengths, timeout_s=5.0, update=update)
    assert run.completed and run.mismatches == [], run.mismatches
    counts = run.observed[0]
    assert counts["all_gather(params)"] >= 3 and counts["all_reduce(max):num_micro_batches"] == 1
    assert ("reduce_scatter(grads)" in counts) == update
    assert ("all_gather_object(metrics)" in counts) == (profile == "engine")
    if profile == "engine" and update:
        assert counts["all_reduce(min):within_limit"] == 2 and counts["all_gather(params)"] == 4
