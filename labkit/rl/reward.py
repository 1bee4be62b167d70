"""The reward of a GRPO step: the rule score per sample, and KL in the reward (``algorithm.use_kl_in_reward=True``):
the fixed / adaptive KL controller and the per-token penalty subtracted from the scores before the advantage.

token_level_rewards = token_level_scores − β·kl(old_log_probs, ref_log_prob; algorithm.kl_penalty)·response_mask;
the logged KL is the per-row masked mean, averaged over rows; β is logged before the controller updates it.
Mirrors verl/trainer/ppo/ray_trainer.py: apply_kl_penalty and verl/trainer/ppo/core_algos.py: FixedKLController,
AdaptiveKLController, get_kl_controller (the same code in 0.7.1 and 0.9.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from labkit.model.tiny_model import load_tiny_tokenizer
from labkit.model.tiny_task import DIGITS_RE, extract_answer, reference_answer
from labkit.protocol.data_proto import DataProto
from labkit.rl.algo import kl_penalty, masked_mean

KL_CTRL = "algorithm.kl_ctrl"


def compute_score(
    prompt: str | Sequence[int],
    response: str,
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Rule reward: ``score`` if the response (up to EOS) equals the answer exactly, ``format_score`` if it is a
    non-empty digit string, else 0.0. Mirrors verl/utils/reward_score/gsm8k.py: compute_score.

    ``prompt`` may be the prompt text or its token ids (decoded with the shipped tiny tokenizer).
    """
    if not isinstance(prompt, str):
        prompt = load_tiny_tokenizer().decode(list(prompt), skip_special_tokens=True)
    answer = extract_answer(response)
    if answer == reference_answer(prompt):
        return float(score)
    if DIGITS_RE.match(answer):
        return float(format_score)
    return 0.0


def compute_scores(prompts: Sequence[str], responses: Sequence[str], **kwargs: float) -> list[float]:
    """Batch form of compute_score; raises if the two lists differ in length."""
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
    return [compute_score(p, r, **kwargs) for p, r in zip(prompts, responses)]


def token_level_scores(batch: DataProto, tokenizer: Any) -> tuple[torch.Tensor, list[float]]:
    """Rule reward per sample on its last response token (zeros elsewhere), from the decoded response.
    Mirrors verl/workers/reward_manager/naive.py: NaiveRewardManager.__call__ with compute_score."""
    resp, mask = batch.batch["responses"], batch.batch["response_mask"]
    scores = torch.zeros(resp.shape, dtype=torch.float32)
    values = []
    for i in range(len(batch)):
        valid = int(mask[i].sum())
        text = tokenizer.decode(resp[i, :valid].tolist(), skip_special_tokens=False)
        values.append(compute_score(str(batch.non_tensor_batch["raw_prompt"][i]), text))
        if valid:
            scores[i, valid - 1] = values[-1]
    return scores, values


@dataclass
class KLController:
    """β of the in-reward KL penalty. ``fixed`` never moves; ``adaptive`` (Ziegler et al. 2019) multiplies β by
    1 + clip(kl/target − 1, ±0.2)·n_steps/horizon. Mirrors core_algos.FixedKLController / AdaptiveKLController."""

    kind: str
    value: float
    target: float | None = None
    horizon: float | None = None

    def update(self, current_kl: float, n_steps: int) -> None:
        if self.kind == "adaptive":
            proportional_error = np.clip(current_kl / self.target - 1, -0.2, 0.2)
            self.value *= 1 + proportional_error * n_steps / self.horizon


def kl_controller(
    kind: str, kl_coef: float, target_kl: float | None = None, horizon: float | None = None
) -> KLController:
    """The controller of ``algorithm.kl_ctrl``. Mirrors core_algos.get_kl_controller (its errors too)."""
    if kind == "fixed":
        return KLController("fixed", kl_coef)
    if kind == "adaptive":
        if not horizon > 0:
            raise AssertionError(f"horizon must be larger than 0. Got {horizon}")
        return KLController("adaptive", kl_coef, target_kl, horizon)
    raise NotImplementedError(f"algorithm.kl_ctrl.type {kind!r} is not implemented (verl: 'fixed' or 'adaptive')")


def kl_controller_from_config(cfg: Any) -> KLController:
    """The controller of ``algorithm.kl_ctrl.{type,kl_coef,target_kl,horizon}``."""
    g = cfg.get
    return kl_controller(
        g(f"{KL_CTRL}.type"), g(f"{KL_CTRL}.kl_coef"), g(f"{KL_CTRL}.target_kl"), g(f"{KL_CTRL}.horizon")
    )


def apply_kl_penalty(
    scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    ctrl: KLController,
    kl_penalty_type: str,
    *,
    profile: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(token_level_rewards, {actor/reward_kl_penalty, actor/reward_kl_penalty_coeff}); updates ``ctrl`` with
    n_steps = rows. Mirrors ray_trainer.apply_kl_penalty."""
    kld = kl_penalty(old_log_probs, ref_log_prob, kl_penalty_type, profile=profile) * response_mask
    beta = ctrl.value
    rewards = scores - beta * kld
    current_kl = torch.mean(masked_mean(kld, response_mask, axis=-1), dim=0).item()
    ctrl.update(current_kl=current_kl, n_steps=scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
