"""GRPO learns: on ``labkit.trainer.recipes.learning_config()`` (16 prompts × n=8, 8 AdamW steps of lr 3e-4 per GRPO step,
fixed prompts, 4 local CPU ranks) the mean rule reward rises over 8 steps by well more than the sampling noise; the
learning rate comes from ``actor_rollout_ref.actor.optim.lr`` unless the trainer is given ``lr``."""

from __future__ import annotations

import math

import pytest

from labkit.rl.hybrid_worker import settings_for
from labkit.runtime.worker_group import live_groups
from labkit.trainer.grpo_trainer import mean_scores, trainer_config
from labkit.trainer.recipes import LEARNING_LR, learning_config, learning_trainer, reward_rise

STEPS = 8  # about 10 s to start the group + 8 × 4–6 s on 2 shared cores
SEED = 0
# Threshold on mean(last 2 steps) − mean(first 2), from benchmarks/bench_grpo_reward.md (8 steps):
#   learning (this config), seeds 0–4: +0.074 … +0.156 (seed 0: +0.145, the run is deterministic on one machine);
#   no learning (same config at lr 0, only sampling noise), seeds 0–2: −0.031 … +0.047; the per-step reward of
#   those runs has sd 0.026, so the rise has noise sd ≈ 0.026.
# 0.06 is ≈ 2.3 noise sd, above every no-learning value and below every learning one (seed 0 is ≈ 5.6 sd): the test
# fails if the update stops moving the policy towards rewarded samples (a sign error, the lr ignored, stale rollout
# weights) or if the learning slows to the noise level.
RISE_MARGIN = 0.06


def test_lr_comes_from_the_config_unless_given():
    assert settings_for(trainer_config()).lr == 1e-6  # verl's default actor.optim.lr
    assert settings_for(trainer_config(["actor_rollout_ref.actor.optim.lr=2e-5"])).lr == 2e-5
    assert settings_for(learning_config()).lr == LEARNING_LR


def test_reward_rise_needs_both_ends():
    assert reward_rise([0.1, 0.2, 0.4, 0.5]) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="needs 4 steps"):
        reward_rise([0.1, 0.2, 0.3])


def test_reward_rises_over_a_few_grpo_steps():
    with learning_trainer(SEED) as tr:
        assert tr.settings.lr == LEARNING_LR and tr.settings.ppo_mini_batch_size == 2
        history = tr.run(STEPS)
        left = tr.close()["left_pids"]
    curve = mean_scores(history)
    rise = reward_rise(curve, 2)
    print(
        f"\ncritic/score/mean over {STEPS} steps (seed {SEED}): {curve}; rise (last 2 − first 2) {rise:+.3f}; "
        f"s/step {[round(h['timing_s/step'], 1) for h in history]}"
    )
    assert left == [] and live_groups() == []
    assert all(math.isfinite(h["actor/pg_loss"]) and math.isfinite(h["actor/grad_norm"]) for h in history)
    assert len(tr.batch) == 128  # 16 prompts × n=8
    assert rise > RISE_MARGIN, f"reward did not rise: {curve} (rise {rise:+.3f} ≤ {RISE_MARGIN})"
