"""Shared data and single-process references for tests/test_actor.py: a verl-shaped batch with rows of different
lengths, the log-probs of one padded forward of the whole batch, and the gradient of the per-profile PPO loss computed
by hand with labkit.rl.algo (no FSDP, no micro-batching machinery), which the live ranks must reproduce."""

from __future__ import annotations

import numpy as np
import torch
from _ulysses_ranks import CFG  # the same 2-layer Qwen2 as the Ulysses tests

from labkit.model.logprob import forward_micro_batch
from labkit.protocol.data_proto import DataProto
from labkit.rl.actor_math import ActorSettings, static_parts
from labkit.rl.actor_model import build_model
from labkit.rl.algo import micro_batch_loss_scale, policy_loss_vanilla

P, R, N, TEMPERATURE = 10, 8, 8, 0.7
# (prompt, response) lengths: 8 rows, response lengths differ (token-mean vs seq-mean), the longest row (18 tokens)
# only in the first half (dp_rank 0 when D = 2), one 1-token response
LENGTHS = [(10, 8), (3, 2), (6, 5), (1, 1), (9, 3), (4, 7), (2, 6), (7, 4)]
KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def base_settings(profile: str = "engine", sp: int = 1, **kw) -> ActorSettings:
    """fp32 tiny Qwen2, SGD with lr 1 (update = -gradient), no clipping, one mini-batch of all N rows."""
    base = dict(
        profile=profile,
        model_config=CFG,
        ulysses_sequence_parallel_size=sp,
        optim="sgd",
        lr=1.0,
        weight_decay=0.0,
        grad_clip=1e9,
        ppo_mini_batch_size=N,
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        log_prob_micro_batch_size_per_gpu=1,
        ref_log_prob_micro_batch_size_per_gpu=2,
    )
    base.update(kw)
    return ActorSettings(**base)


def make_batch(seed: int = 0) -> DataProto:
    """Left-padded prompts, right-padded responses, advantages per row (broadcast over the response mask)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((N, P + R), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, (p, r) in enumerate(LENGTHS):
        ids[i, P - p : P + r] = rng.integers(1, CFG["vocab_size"], size=p + r)
        mask[i, P - p : P + r] = 1
    t = {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask),
        "position_ids": torch.from_numpy(np.clip(np.cumsum(mask, 1) - 1, 0, None)),
    }
    t["responses"] = t["input_ids"][:, P:].clone()
    t["response_mask"] = t["attention_mask"][:, P:].clone()
    t["advantages"] = torch.from_numpy(rng.normal(size=(N, 1)).astype(np.float32)) * t["response_mask"]
    return DataProto.from_dict(tensors=t, meta_info={"temperature": TEMPERATURE})


def reference_log_probs(data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """One padded forward of all rows in one process: (log_probs, entropy)."""
    model = build_model(base_settings()).eval()
    with torch.no_grad():
        return forward_micro_batch(
            model,
            {k: data.batch[k] for k in KEYS},
            use_remove_padding=False,
            temperature=TEMPERATURE,
            calculate_entropy=True,
        )


def initial_params() -> dict[str, np.ndarray]:
    return {n: p.detach().numpy().copy() for n, p in build_model(base_settings()).named_parameters()}


def hand_update(
    data: DataProto, profile: str, mode: str, dp_size: int, micro: int | None
) -> tuple[dict[str, np.ndarray], float, float]:
    """-gradient of what verl optimises for one mini-batch of all N rows, DP rank d holding rows chunk d, and the
    pg_loss metric and gradient norm. engine: Σ_micro agg(global denominators, × D), averaged over D (FSDP);
    legacy (on-policy, ratio 1): Σ_micro agg(local) × 1/GA (static, micro) or the global seq-mean (dynamic:
    rows/M′ × local seq-mean = Σ_seq/M′, ``micro`` None), averaged over D."""
    model = build_model(base_settings()).train()
    logp, _ = forward_micro_batch(
        model, {k: data.batch[k] for k in KEYS}, use_remove_padding=False, temperature=TEMPERATURE
    )
    mask, adv = data.batch["response_mask"], data.batch["advantages"]
    rows = N // dp_size
    info = {}
    if profile == "engine":
        info = dict(dp_size=dp_size, batch_num_tokens=int(mask.sum()), global_batch_size=N, loss_scale_factor=None)
    total, metric = 0.0, 0.0
    for d in range(dp_size):
        parts = static_parts(profile, rows, micro) if micro else [list(range(rows))]
        for part in parts:
            idx = [d * rows + i for i in part]
            loss, _ = policy_loss_vanilla(
                logp[idx].detach(),
                logp[idx],
                adv[idx],
                mask[idx],
                loss_agg_mode=mode,
                profile=profile,
                global_batch_info=info,
            )
            scale = 1.0
            if profile == "legacy":
                scale = (
                    micro_batch_loss_scale("legacy", "static", len(idx), rows, rows // micro)
                    if micro
                    else micro_batch_loss_scale("legacy", "dynamic", len(idx), rows)
                )
            total = total + loss * scale / dp_size
            metric += float(loss.detach()) * scale / dp_size
    total.backward()
    grads = {n: -p.grad.numpy().copy() for n, p in model.named_parameters()}
    norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
    return grads, metric, norm
