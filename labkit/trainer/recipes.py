"""A GRPO config under which the tiny task's reward visibly rises within a handful of steps, and its reward curve.

The trainer's default shape (8 prompts × n=4, one optimizer step per GRPO step, verl's lr 1e-6) shows the pipeline but
learns nothing visible in a few steps. ``learning_config()`` keeps the same GRPO step (same rollout, rule reward, old
log-prob, group-normalised advantages, clipped PPO loss, FSDP2 AdamW update) and changes only ordinary verl knobs
(verl/trainer/config/ppo_trainer.yaml keys):

* ``data.train_batch_size=16`` prompts × ``rollout.n=8`` samples = 128 samples per step (less noise, more groups
  with mixed outcomes, the only ones GRPO learns from);
* ``actor.ppo_mini_batch_size=2`` prompts: 8 AdamW steps per GRPO step (PPO clipping keeps them near the sampling
  policy, as in verl);
* ``actor.optim.lr=3e-4`` (AdamW, weight decay 0.01 as verl's default); at 1e-3 (8 updates per step) the reward fell
  back on one seed of two in our screening runs, 5e-4 was no faster;
* ``rollout.name=hf``: the HF engine, on which the curves below were measured (vLLM samples another token stream
  from the same seed, so its curve, and its rise, differ run for run);
* the trainer's ``fixed_prompts=True``: the same 16 prompts at every step, so the curve shows the policy changing
  rather than the prompt draw (with fresh prompts, the draw alone moves the mean with sd ≈ 0.13).

Measured (benchmarks/bench_grpo_reward.md, 5 seeds): the mean of the last 2 of 8 steps minus the mean of the first 2
rose by +0.07 to +0.16 (by +0.09 to +0.18 after 10 steps), against −0.03 to +0.05 for the same config at lr 0 (no
learning; per-step noise sd 0.026). With fresh prompts per step no rise is visible in 10 steps (the prompt draw has
sd 0.13). A step takes 4–5 s on 2 shared cores, plus about 7–13 s to start the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.config.keys import ARR
from labkit.config.verl_config import VerlConfig
from labkit.trainer.grpo_trainer import GRPOTrainer, trainer_config

LEARNING_LR = 3e-4
LEARNING_OVERRIDES = (
    "data.train_batch_size=16",
    f"{ARR}.rollout.n=8",
    f"{ARR}.actor.ppo_mini_batch_size=2",
    f"{ARR}.actor.optim.lr={LEARNING_LR}",
    f"{ARR}.rollout.name=hf",
)
LEARNING_FIXED_PROMPTS = True


def learning_config(overrides: Sequence[str] = ()) -> VerlConfig:
    """The trainer's 4-rank GRPO defaults + LEARNING_OVERRIDES (+ ``overrides``, applied last)."""
    return trainer_config([*LEARNING_OVERRIDES, *overrides])


def learning_trainer(
    seed: int = 0,
    *,
    launcher: str = "local",
    lr: float | None = None,
    progress: bool = False,
    fixed_prompts: bool = LEARNING_FIXED_PROMPTS,
    overrides: Sequence[str] = (),
) -> GRPOTrainer:
    """A GRPOTrainer on learning_config() (fixed prompts unless told); ``lr`` (e.g. 0 for a no-learning control)
    overrides the config's ``actor.optim.lr`` when given."""
    return GRPOTrainer(
        learning_config(overrides), launcher=launcher, seed=seed, lr=lr, progress=progress, fixed_prompts=fixed_prompts
    )


def learning_run(steps: int, seed: int = 0, **kwargs: Any) -> list[dict[str, Any]]:
    """``steps`` GRPO steps of learning_trainer(seed, **kwargs); the metrics of each (the group is closed after)."""
    with learning_trainer(seed, **kwargs) as tr:
        return tr.run(steps)


def reward_rise(curve: Sequence[float], k: int = 2) -> float:
    """Mean of the last ``k`` rewards minus mean of the first ``k`` (needs ``len(curve) >= 2k``)."""
    if len(curve) < 2 * k:
        raise ValueError(f"a reward rise over {k} first and {k} last steps needs {2 * k} steps, got {len(curve)}")
    return sum(curve[-k:]) / k - sum(curve[:k]) / k
