"""The gap between the rollout engine's log-probs of the sampled tokens (``rollout_log_probs``) and the actor's
recomputed ``old_log_probs``, under verl's metric names, and per token for the lesson.

verl logs it after old_log_prob whenever the batch carries ``rollout_log_probs`` (verl/trainer/ppo/ray_trainer.py:
RayPPOTrainer.fit; 0.9.1's v1 loop when rollout.calculate_log_probs: trainer/ppo/v1/trainer_base.py:
_compute_old_log_prob). Note that verl compares probabilities, not log-probabilities: |exp(a) − exp(b)|.
Mirrors verl/utils/debug/metrics.py: calculate_debug_metrics.
"""

from __future__ import annotations

import math

import torch

from labkit.protocol.data_proto import DataProto

NAMES = (
    "training/rollout_probs_diff_valid",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
)


def _mask(batch: DataProto) -> torch.Tensor:
    """The response mask as verl picks it: response_mask, else the response part of attention_mask, else ones."""
    b = batch.batch
    width = b["responses"].shape[1]
    if "response_mask" in b.keys():
        return b["response_mask"][:, -width:].bool()
    if "attention_mask" in b.keys():
        return b["attention_mask"][:, -width:].bool()
    return torch.ones_like(b["rollout_log_probs"], dtype=torch.bool)


def rollout_probs_diff(batch: DataProto) -> dict[str, float]:
    """verl's five metrics of the rollout-vs-actor gap (valid 0 and NaNs when no response token is left)."""
    mask = _mask(batch)
    if not bool(mask.any()):
        return {NAMES[0]: 0, **{n: math.nan for n in NAMES[1:]}}
    actor = torch.exp(batch.batch["old_log_probs"].float())[mask]
    rollout = torch.exp(batch.batch["rollout_log_probs"].float())[mask]
    diff = (actor - rollout).abs()
    corr = torch.corrcoef(torch.stack([actor, rollout]))[0, 1] if actor.numel() > 1 else torch.tensor(math.nan)
    return {
        NAMES[0]: 1,
        NAMES[1]: float(diff.max()),
        NAMES[2]: float(diff.mean()),
        NAMES[3]: float(diff.std()) if diff.numel() > 1 else math.nan,
        NAMES[4]: float(corr),
    }


def token_gap(batch: DataProto) -> dict[str, torch.Tensor]:
    """Per response token (masked tokens left out, row-major): the engine's and the actor's log-probs, their
    difference ``rollout − actor`` and the token's position in its response."""
    mask = _mask(batch)
    rollout = batch.batch["rollout_log_probs"].float()
    actor = batch.batch["old_log_probs"].float()
    position = torch.arange(mask.shape[1]).expand_as(mask)
    return {
        "rollout": rollout[mask],
        "actor": actor[mask],
        "diff": (rollout - actor)[mask],
        "position": position[mask],
    }


def micro_batch_gap(
    batch: DataProto, dtype: str, micro_sizes: tuple[int, ...] = (1, 4, 16), model_path: str | None = None
) -> dict[int, torch.Tensor]:
    """The same response tokens scored by the actor's forward (``labkit.model.logprob.forward_micro_batch``, packed
    rows) in micro-batches of each size, in ``dtype``: per micro size, every response token's log-prob minus its
    log-prob at ``micro_sizes[0]`` (masked tokens left out). Zero would mean batch-invariant kernels; in bf16 they are
    not (verl issue 6280: old_log_prob and log_prob differ when the two passes use different micro-batch sizes)."""
    from labkit.model.logprob import forward_micro_batch
    from labkit.rl.hf_engine import load_rollout_model

    model, _ = load_rollout_model(model_path, dtype)
    model.config.use_cache = False
    keys = ("input_ids", "attention_mask", "position_ids", "responses")
    scored = {}
    for micro in micro_sizes:
        parts = []
        for i in range(0, len(batch), micro):
            with torch.no_grad():
                lp, _ = forward_micro_batch(
                    model, {k: batch.batch[k][i : i + micro] for k in keys}, use_remove_padding=True
                )
            parts.append(lp.float())
        scored[micro] = torch.cat(parts)
    mask = _mask(batch)
    return {m: (scored[m] - scored[micro_sizes[0]])[mask] for m in micro_sizes}
