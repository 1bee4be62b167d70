"""The RL math of one PPO/GRPO step, per profile: GRPO outcome advantage, PPO clipped loss, loss aggregation,
KL estimators. Mirrors verl/trainer/ppo/core_algos.py; log-probs and entropy from logits are in ``labkit.model.logits``.

Profiles (docs/profiles.md): ``engine`` = verl 0.9.1 (global denominators × dp_size, ``token-sum`` exists, no
per-micro-batch factor); ``legacy`` = the 0.7.1 legacy worker path (``dp_actor`` passes no global info, so
``agg_loss`` uses the micro-batch's own denominators, and the loss is then scaled by ``micro_batch_loss_scale``).
Legacy ``seq-mean-token-sum-norm`` follows 0.7.1 (seq-mean, then /R); a 0.8.0.dev snapshot
predates verl PR #5366 and divided the plain Σ by R, without the seq-mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from labkit.config.keys import PROFILES

LOSS_AGG_MODES: dict[str, tuple[str, ...]] = {
    "legacy": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    "engine": ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
}
KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # engine: each also with a trailing "+"


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {list(PROFILES)}, got {profile!r}.")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set; NaNs outside the mask are ignored. Mirrors verl_F.masked_sum."""
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Masked mean with verl's 1e-8 guard, so an all-empty mask gives 0, not NaN. Mirrors verl_F.masked_mean."""
    return masked_sum(values, mask, axis) / (mask.sum(axis=axis) + 1e-8)


# ----------------------------------------------------------------------------------------------- advantage


def grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: score = Σ_t reward, normalised within each uid group (unbiased std; a group of one
    gets mean 0, std 1, so its advantage is score/(1+ε), not 0). Returns (advantages, returns), equal.
    Dtypes follow verl: a group's mean and std are in the scores' dtype, but a group of one uses float32 scalars
    (``torch.tensor(0.0)``, ``torch.tensor(1.0)``), so its 1 + ε is rounded to float32 even for float64 rewards.
    Mirrors verl/trainer/ppo/core_algos.py: compute_grpo_outcome_advantage."""
    scores = token_level_rewards.sum(dim=-1)
    if len(index) != scores.shape[0]:
        raise ValueError(f"index has {len(index)} uids but token_level_rewards has {scores.shape[0]} rows")
    rows_of: dict[Any, list[int]] = {}
    for row, uid in enumerate(index):
        rows_of.setdefault(uid, []).append(row)
    with torch.no_grad():
        single_mean, single_std = torch.tensor(0.0), torch.tensor(1.0)  # verl's float32 scalars for a group of one
        single_denom = single_std + epsilon  # rounded to float32, as verl's id2std + epsilon
        # verl divides 0-dim tensors one row at a time: the quotient has the promoted dtype, stored back as scores'
        work = torch.promote_types(scores.dtype, single_std.dtype)
        adv = torch.empty_like(scores)
        for rows in rows_of.values():
            group = scores[rows]
            if len(rows) > 1:
                mean, std = torch.mean(group), torch.std(group)  # std: Bessel-corrected (N-1), in scores' dtype
                centred = group - mean
                adv[rows] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
            else:
                centred = group.to(work) - single_mean
                adv[rows] = (centred / single_denom if norm_adv_by_std_in_grpo else centred).to(scores.dtype)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


# ----------------------------------------------------------------------------------------------- aggregation


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    profile: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: int | float | None = None,
) -> torch.Tensor:
    """Aggregate a (bsz, R) loss matrix to a scalar. Without global info the denominators are this micro-batch's
    own (what the legacy dp_actor always gets); with them (engine) Σ/global × dp_size, so summing micro-batches
    and FSDP-averaging ranks gives the exact global mean. Mirrors core_algos.agg_loss (0.7.1 legacy, 0.9.1 engine)."""
    _check_profile(profile)
    if loss_agg_mode not in LOSS_AGG_MODES[profile]:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    if loss_agg_mode == "token-sum":  # engine only: the ×dp_size undoes FSDP's gradient average
        return masked_sum(loss_mat, loss_mask) * dp_size
    token_count = torch.sum(loss_mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (token_count + 1e-8)
    else:  # seq-mean-token-sum[-norm]
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
    seq_mask = (token_count > 0).float()  # fully masked rows count for nothing
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError("global_batch_size is required when dp_size > 1")
        global_batch_size = seq_mask.sum()
    loss = masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":  # Dr.GRPO: a constant horizon instead of the token count
        loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return loss


def micro_batch_loss_scale(
    profile: str,
    batching: str,
    rows_in_micro: int,
    normalized_mini: int,
    ga: int | None = None,
) -> float:
    """Factor s applied to a micro-batch's loss before backward. legacy: static 1/GA (GA = M′ // m), dynamic
    rows/M′ — both under-weight a short last mini-batch; engine: 1, the global denominators in ``agg_loss`` do it.
    Mirrors verl/workers/actor/dp_actor.py: update_policy (legacy) and verl/workers/utils/losses.py: ppo_loss."""
    _check_profile(profile)
    if batching not in ("static", "dynamic"):
        raise ValueError(f"batching must be 'static' or 'dynamic', got {batching!r}")
    if profile == "engine":
        return 1.0
    if batching == "dynamic":
        if normalized_mini <= 0:
            raise ValueError(f"normalized ppo_mini_batch_size must be > 0, got {normalized_mini}")
        return rows_in_micro / normalized_mini
    if not ga:
        raise ValueError(f"static micro-batching needs gradient_accumulation = M' // m > 0, got {ga}")
    return 1 / ga


# ----------------------------------------------------------------------------------------------- policy loss


def policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = 0.2,
    clip_ratio_high: float | None = 0.2,
    clip_ratio_c: float = 3.0,
    profile: str = "engine",
    global_batch_info: Mapping[str, Any] | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with dual clip for A < 0, aggregated by ``agg_loss``. ``global_batch_info`` holds
    dp_size / batch_num_tokens / global_batch_size / loss_scale_factor (engine; the legacy path passes none).
    Returns (pg_loss, {actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower}).
    Mirrors verl/trainer/ppo/core_algos.py: compute_policy_loss_vanilla."""
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if not clip_ratio_c > 1.0:  # verl's assert, kept under python -O
        raise AssertionError(
            "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0,"
            + f" but get the value: {clip_ratio_c}."
        )
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # clamp before exp, for stability
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    pessimistic = torch.maximum(unclipped, clipped)
    pg_clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)
    dual_bound = -advantages * clip_ratio_c  # caps the loss of a negative-advantage token at c·|A|
    dual_clipped = torch.min(dual_bound, pessimistic)
    pg_clipfrac_lower = masked_mean(torch.gt(pessimistic, dual_bound) * (advantages < 0).float(), response_mask)
    pg_losses = torch.where(advantages < 0, dual_clipped, pessimistic)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, profile=profile, **dict(global_batch_info or {}))
    metrics = {
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
    }
    return pg_loss, metrics


# ----------------------------------------------------------------------------------------------- KL


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty_type: str) -> torch.Tensor:
    """Per-token KL estimate: k1 = Δ, abs = |Δ|, k2 = ½Δ², k3 = e^(−Δ) + Δ − 1 clamped to [−10, 10] (Δ = logp −
    ref, clamped to ±20 first). Mirrors verl/trainer/ppo/core_algos.py: kl_penalty_forward."""
    if kl_penalty_type in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty_type == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty_type in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty_type in ("low_var_kl", "k3"):
        log_ref_ratio = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp((torch.exp(log_ref_ratio) - log_ref_ratio - 1).contiguous(), min=-10, max=10)
    raise NotImplementedError(f"kl_penalty {kl_penalty_type!r} is not implemented; use one of {KL_PENALTY_TYPES}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty_type: str, *, profile: str) -> torch.Tensor:
    """KL estimate; engine: a trailing "+" (e.g. "k3+") keeps the forward value but takes the gradient of k2 (the
    unbiased KL gradient, straight-through). Mirrors core_algos.kl_penalty: 0.9.1 strips the "+" before
    kl_penalty_forward; 0.7.1 (legacy) passes "k3+" on as is, where it falls through to NotImplementedError."""
    _check_profile(profile)
    plus = kl_penalty_type.endswith("+")
    if plus and profile == "legacy":
        raise NotImplementedError(
            f"kl_penalty {kl_penalty_type!r} is not implemented in the legacy profile: verl "
            f"0.7.1's kl_penalty_forward has no '+' names (bare NotImplementedError); use one "
            f"of {KL_PENALTY_TYPES}"
        )
    forward = kl_penalty_forward(logprob, ref_logprob, kl_penalty_type[:-1] if plus else kl_penalty_type)
    if not plus:
        return forward
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + forward.detach()
