"""A full GRPO step live on 4 CPU ranks (shipped tiny model, 8 prompts × n=4): it completes with verl's metric names,
its live trace equals the planner's prediction (balance, old_log_prob, update_actor: rows, tokens, padded tokens,
micro-batches, mini-batches, collectives per rank), the driver's GRPO advantages equal verl's on the same scores and
are grouped by uid, the rollout really samples from the updated actor, a few steps keep everything finite (the reward
curve is printed), and nothing is left behind when the trainer exits."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from labkit.runtime.worker_group import live_groups
from labkit.trace import compare
from labkit.trainer.grpo_trainer import GRPOTrainer, mean_scores, trainer_config
from labkit.trainer.live_trace import COMPARED, FIELDS

EXTRA_STEPS = 4  # after the first: 5 GRPO steps in all (about 7 s each on 2 shared cores)
LR = 1e-3
HF = "actor_rollout_ref.rollout.name=hf"  # the HF engine: these tests are about the step, not the vLLM engine
_STATE: dict = {}


@pytest.fixture(scope="module")
def trainer():
    tr = GRPOTrainer([HF], launcher="local", seed=0, lr=LR, progress=False, fixed_prompts=True)
    _STATE["trainer"] = tr
    try:
        yield tr
    finally:
        report = tr.close()
        _STATE["report"] = report


@pytest.fixture(scope="module")
def first(trainer):
    """The first step's metrics, trace and prediction."""
    metrics = trainer.step()
    return metrics, trainer.trace, trainer.prediction(), trainer.batch


def test_bad_config_fails_before_any_process_starts():
    with pytest.raises(ValueError, match="adv_estimator=grpo"):
        GRPOTrainer(["algorithm.adv_estimator=gae"], launcher="local")
    with pytest.raises(ValueError, match=r"ref.ulysses_sequence_parallel_size=1 must equal the actor's 2"):
        GRPOTrainer(
            [
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
            ],
            launcher="local",
        )
    assert live_groups() == []


def test_full_step_completes_with_verls_metric_names(first):
    metrics, trace, _, batch = first
    for key in (
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/grad_norm",
        "actor/entropy",
        "critic/score/mean",
        "critic/advantages/mean",
        "response_length/mean",
        "prompt_length/mean",
        "global_seqlen/min",
        "global_seqlen/max",
        "global_seqlen/minmax_diff",
        "global_seqlen/balanced_max",
        "timing_s/gen",
        "timing_s/reward",
        "timing_s/old_log_prob",
        "timing_s/adv",
        "timing_s/update_actor",
        "timing_s/update_weights",
        "timing_s/step",
        "perf/total_num_tokens",
        "perf/throughput",
    ):
        assert key in metrics, key
        assert math.isfinite(metrics[key]), key
    assert "timing_s/ref" not in metrics  # no KL loss → no reference policy, as verl's need_reference_policy
    assert len(batch) == 32 and metrics["perf/total_num_tokens"] == int(batch.batch["attention_mask"].sum())
    assert metrics["timing_s/step"] >= sum(metrics[f"timing_s/{k}"] for k in ("gen", "old_log_prob", "update_actor"))
    for stage in ("generate", "balance", "old_log_prob", "update_actor"):
        assert [r.rank for r in trace.at(stage)] == [0, 1, 2, 3], stage
    for stage in ("generate", "old_log_prob", "update_actor"):
        assert all(r.bytes_measured and r.bytes_measured > 10_000_000 for r in trace.at(stage)), stage


def test_live_trace_equals_prediction(first):
    _, trace, predicted, batch = first
    assert predicted.summary["ok"], predicted.summary["stage_errors"]
    mismatches = compare(predicted, trace, stages=list(COMPARED[:2]) + ["update_actor"], fields=FIELDS)
    assert mismatches == [], "\n".join(map(str, mismatches))
    assert compare(predicted, trace, stages=["generate"], fields=("rows", "dp_rank", "tp_rank")) == []
    # balance: the planner's KK partition is the one the driver applied, and verl's metrics agree
    assert [r.extra["indices"] for r in trace.at("balance")] == [r.extra["indices"] for r in predicted.at("balance")]
    assert {k: v for k, v in trace.summary["metrics"].items() if k.startswith("global_seqlen/")} == predicted.summary[
        "global_seqlen"
    ]
    # something non-trivial was compared: 2 micro-batches per rank and collectives at the update
    upd = trace.at("update_actor")
    assert all(r.n_micro == 2 and r.collectives.get("reduce_scatter(grads)") == 1 for r in upd)
    assert sum(r.tokens for r in trace.at("old_log_prob")) == int(batch.batch["attention_mask"].sum())


def test_grpo_advantages_equal_verls_and_group_by_uid(first):
    _, _, _, batch = first
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    b = batch.batch
    uid = batch.non_tensor_batch["uid"]
    adv, ret = core_algos.compute_grpo_outcome_advantage(b["token_level_rewards"], b["response_mask"], uid)
    torch.testing.assert_close(b["advantages"], adv, rtol=0, atol=1e-6)
    torch.testing.assert_close(b["returns"], ret, rtol=0, atol=1e-6)
    # groups are the n=4 samples of one prompt (same uid ⇔ same prompt), spread over ranks by _balance_batch
    groups: dict = {}
    for i, u in enumerate(uid):
        groups.setdefault(u, []).append(i)
    assert len(groups) == 8 and all(len(rows) == 4 for rows in groups.values())
    assert all(len({batch.non_tensor_batch["raw_prompt"][i] for i in rows}) == 1 for rows in groups.values())
    scores = b["token_level_scores"].sum(-1)
    for rows in groups.values():
        s = scores[rows]
        want = (s - s.mean()) / (s.std() + 1e-6)
        last = b["response_mask"][rows].sum(-1) - 1
        got = b["advantages"][rows, :].gather(1, last.unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # a permutation of the batch gives the same advantages per row (grouping by uid, not by position)
    perm = torch.randperm(len(batch), generator=torch.Generator().manual_seed(0))
    adv_p, _ = core_algos.compute_grpo_outcome_advantage(
        b["token_level_rewards"][perm], b["response_mask"][perm], uid[perm.numpy()]
    )
    torch.testing.assert_close(adv_p, b["advantages"][perm], rtol=0, atol=1e-6)


def test_rollout_samples_from_the_updated_actor(trainer, first):
    """update_weights copied the actor's full weights into every rank's rollout model."""
    full = trainer.wg.full_params()[0]
    digest = float(sum(np.asarray(v, dtype=np.float64).sum() for v in full.values()))
    assert all(abs(s["digest"] - digest) <= 1e-6 * max(1.0, abs(digest)) for s in trainer.synced)


def test_the_update_raises_the_log_prob_of_good_samples(trainer, first):
    """After update_actor, Σ advantage · (log π_new − log π_old) over the step's response tokens is > 0: policy
    moved towards the samples GRPO rewarded (the reward curve itself is too noisy at 32 samples per step)."""
    from labkit.rl import actor_client as ar

    batch = first[3]
    new = ar.compute_log_prob(trainer.wg, batch, stage="check_log_prob").batch["old_log_probs"]
    mask = batch.batch["response_mask"].bool()
    delta = (new - batch.batch["old_log_probs"])[mask]
    gain = float((batch.batch["advantages"][mask] * delta).sum())
    print(f"\nΣ A·Δlog π after one step: {gain:.4f}")
    assert delta.abs().max() > 0 and gain > 0


def test_a_few_steps_stay_finite_and_report_the_reward_curve(trainer, first):
    before = trainer.synced[0]["digest"]
    for _ in range(EXTRA_STEPS):
        m = trainer.step()
        assert trainer.mismatches() == [], trainer.mismatches()
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float))
    curve = mean_scores(trainer.history)
    print(f"\ncritic/score/mean over {len(curve)} GRPO steps (lr {LR}, seed 0, fixed prompts): {curve}")
    assert len(curve) == 1 + EXTRA_STEPS and all(0.0 <= x <= 1.0 for x in curve)
    assert trainer.synced[0]["digest"] != before  # the weights moved and reached the rollout


def test_the_lr_argument_overrides_the_config(trainer):
    assert trainer.cfg.get("actor_rollout_ref.actor.optim.lr") == 1e-6 and trainer.settings.lr == LR


def test_nothing_left_behind(trainer, first):
    trainer.close()
    trainer.close()  # idempotent
    assert trainer.wg.alive_pids() == []
    assert live_groups() == []


@pytest.mark.slow
def test_sp_tp_dynamic_kl_step_equals_prediction():
    """Rollout TP 2, Ulysses SP 2 (DP 2), dynamic bsz (budget 64/GPU) and the KL loss (so a ref stage): one step, the
    live trace equals the planner's at balance, old_log_prob, ref_log_prob and update_actor, Ulysses all-to-alls
    included; the group is gone afterwards."""
    from labkit.ui.trainer_panels import step_config

    cfg = step_config(sp=2, tp=2, dynamic=True, budget=64, use_kl_loss=True).override([HF])
    with GRPOTrainer(cfg, launcher="local", seed=1, lr=LR, progress=False) as tr:
        m = tr.step()
        assert tr.mismatches() == [], tr.mismatches()
        live = tr.trace
    assert "timing_s/ref" in m and math.isfinite(m["actor/kl_loss"])
    assert [r.dp_rank for r in live.at("old_log_prob")] == [0, 0, 1, 1]
    assert [r.tp_rank for r in live.at("generate")] == [0, 1, 0, 1]
    assert all(r.collectives.get("all_to_all(ulysses)") for r in live.at("update_actor"))
    assert tr.wg.alive_pids() == [] and live_groups() == []


def test_config_defaults_are_the_issue_shape():
    cfg = trainer_config()
    assert (cfg.get("data.train_batch_size"), cfg.get("actor_rollout_ref.rollout.n"), cfg.n_gpus) == (8, 4, 4)


def _metrics_batch(resp_lens: list[int]):
    """A driver batch (no critic) with the given response lengths (0 = an aborted sample)."""
    from labkit.protocol.data_proto import DataProto

    g = torch.Generator().manual_seed(len(resp_lens))
    rows, P, R = len(resp_lens), 5, 6
    prompt = (torch.arange(P)[None, :] >= torch.randint(0, P, (rows, 1), generator=g)).long()
    resp = (torch.arange(R)[None, :] < torch.tensor(resp_lens)[:, None]).long()
    t = {
        "prompts": torch.ones(rows, P, dtype=torch.long),
        "responses": torch.ones(rows, R, dtype=torch.long),
        "attention_mask": torch.cat([prompt, resp], 1),
        "response_mask": resp,
    }
    for k in ("token_level_scores", "token_level_rewards", "advantages", "returns"):
        t[k] = torch.randn(rows, R, generator=g) * resp
    return DataProto.from_dict(tensors=t)


def test_data_metrics_match_verl_compute_data_metrics():
    """critic/score|rewards over non-aborted rows, response_length_non_aborted/*, response/aborted_ratio: labkit's
    data_metrics vs verl 0.9.1's compute_data_metrics (engine) and 0.7.1's, compiled from its source (legacy)."""
    from _oracle_legacy import load_function
    from verl import DataProto as VerlDataProto
    from verl.trainer.ppo import metric_utils

    from labkit.trainer.grpo_trainer import data_metrics

    oracle = Path(__file__).resolve().parents[1] / ".oracle" / "verl-0.7.1" / "verl" / "trainer" / "ppo"
    ns = {
        "torch": torch,
        "np": np,
        "Any": object,
        "DataProto": VerlDataProto,
        "_compute_response_info": metric_utils._compute_response_info,
    }
    legacy_fn = load_function(oracle / "metric_utils.py", "compute_data_metrics", ns)
    for lens in ([3, 0, 6, 1, 0, 6], [2, 4, 6], [0, 0, 0]):
        b = _metrics_batch(lens)
        vb = VerlDataProto.from_dict(tensors=dict(b.batch.items()))
        for profile, fn in (("engine", metric_utils.compute_data_metrics), ("legacy", legacy_fn)):
            theirs, err = None, None
            try:
                theirs = fn(vb, use_critic=False)
            except Exception as exc:  # noqa: BLE001 - 0.7.1 raises when every sample is aborted
                err = type(exc)
            if err is not None:
                with pytest.raises(err):
                    data_metrics(b, 6, 5, profile)
                continue
            mine = data_metrics(b, 6, 5, profile)
            assert set(mine) == set(theirs), set(mine) ^ set(theirs)
            np.testing.assert_allclose(
                [mine[k] for k in sorted(mine)],
                [theirs[k] for k in sorted(mine)],
                rtol=1e-6,
                equal_nan=True,
                err_msg=f"{profile} {lens}",
            )
    assert data_metrics(_metrics_batch([0, 2]), 6, 5, "legacy")["response/aborted_ratio"] == 0.5


def test_kl_in_reward_step_runs_the_ref_and_penalises_the_scores():
    """algorithm.use_kl_in_reward (k1): the ref pass runs, token_level_rewards = scores − β·kl·mask (adaptive β
    logged before its update), verl's actor/reward_kl_penalty{,_coeff} are logged. ray_trainer.apply_kl_penalty.
    With model.use_remove_padding=false, whose engine layout (rows x the micro-batch's longest row) the plan shares."""
    from labkit.rl.algo import kl_penalty, masked_mean

    with GRPOTrainer(
        [
            "algorithm.use_kl_in_reward=true",
            "algorithm.kl_penalty=kl",
            "algorithm.kl_ctrl.type=adaptive",
            "algorithm.kl_ctrl.kl_coef=0.5",
            "algorithm.kl_ctrl.horizon=64",
            "actor_rollout_ref.model.use_remove_padding=false",
            HF,
        ],
        launcher="local",
        seed=1,
        lr=LR,
        progress=False,
    ) as tr:
        first = tr.step()  # actor = reference: KL ≈ 0, the adaptive β shrinks by (1 − 0.2·rows/horizon)
        beta = tr.kl_ctrl_in_reward.value
        m = tr.step()  # the actor has moved: KL > 0
        b = tr.batch.batch
        # rmpad off on the engine: every micro-batch is padded to its own longest row, as predicted
        assert tr.mismatches() == [], tr.mismatches()
        width = b["attention_mask"].shape[1]
        micros = [mb for r in tr.trace.at("old_log_prob") + tr.trace.at("update_actor") for mb in r.micro_batches]
        assert all(mb.padded_tokens <= mb.rows * width for mb in micros)
        assert all(mb.padded_tokens >= mb.tokens for mb in micros) and any(
            mb.padded_tokens > mb.tokens for mb in micros
        )
        assert any(mb.padded_tokens < mb.rows * width for mb in micros)  # not the legacy full width
    assert "timing_s/ref" in m and first["actor/reward_kl_penalty_coeff"] == 0.5
    assert beta == pytest.approx(0.5 * (1 - 0.2 * 32 / 64)) and m["actor/reward_kl_penalty_coeff"] == beta
    kl = kl_penalty(b["old_log_probs"], b["ref_log_prob"], "kl", profile="engine") * b["response_mask"]
    assert float(kl.abs().max()) > 1e-5, float(kl.abs().max())
    torch.testing.assert_close(b["token_level_rewards"], b["token_level_scores"] - beta * kl, rtol=0, atol=0)
    assert m["actor/reward_kl_penalty"] == pytest.approx(float(masked_mean(kl, b["response_mask"], -1).mean()))
    assert m["actor/reward_kl_penalty"] != 0
