"""update_policy on one rank: mini-batches × ppo_epochs, micro-batches for gradient accumulation, the PPO loss scaled
per profile, gradient clipping with the non-finite skip, and verl's metrics.

legacy (verl ≤ 0.7 dp_actor): mini = M′ (normalised at construction), ``split`` (ragged last allowed), on-policy
shortcut, per-micro-batch local denominators × s (1/GA static, rows/M′ dynamic), gradient sync every micro-batch.
engine (0.9.1): mini = (M·n)/D (E28), iterator (E29, seed 42 + dp_rank), global denominators (mini-batch tokens
all-reduced over DP, M·n, × dp_size), gradient sync on the last micro-batch only.
Mirrors verl/workers/actor/dp_actor.py: update_policy / _optimizer_step and verl/workers/engine_workers.py:
TrainingWorker.train_mini_batch, verl/workers/engine/fsdp/transformer_impl.py: forward_backward_batch,
optimizer_step, verl/workers/utils/losses.py: ppo_loss.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.model.logprob import forward_micro_batch
from labkit.protocol.data_proto import DataProto
from labkit.rl import actor_math as am
from labkit.rl.actor_metrics import global_token_num, postprocess
from labkit.rl.actor_record import CallRecord
from labkit.rl.algo import agg_loss, kl_penalty, micro_batch_loss_scale, policy_loss_vanilla
from labkit.runtime import dist

UPDATE_KEYS = (
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "old_log_probs",
    "advantages",
)


def engine_schedule(rows: int, mini: int, epochs: int, seed: int, shuffle: bool) -> list[list[int]]:
    """Row indices of every mini-batch over all epochs, as DataProto.make_iterator draws them (E29)."""
    probe = DataProto.from_dict(tensors={"row": torch.arange(rows)})
    return [mb.batch["row"].tolist() for mb in probe.make_iterator(mini, epochs, seed=seed, shuffle=shuffle)]


def optimizer_step(w: Any, rec: CallRecord) -> float:
    """Clip to grad_clip (the norm of DTensor grads is all-reduced), skip the step when it is not finite.
    Mirrors dp_actor._optimizer_step / FSDPEngine.optimizer_step."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(list(w.model.parameters()), max_norm=w.s.grad_clip)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    rec.count("all_reduce(sum):grad_norm")
    if not torch.isfinite(norm):
        print(f"WARN: rank {w.rank} grad_norm is not finite: {norm}")
        w.optimizer.zero_grad()
    else:
        w.optimizer.step()
    return float(norm)


def run_update(w: Any, data: DataProto) -> DataProto:
    """The whole update of one rank; returns DataProto(meta_info={"metrics": ...}) (verl's shape)."""
    s, sp = w.s, w.s.ulysses_sequence_parallel_size
    legacy = s.profile == "legacy"
    missing = [k for k in UPDATE_KEYS + (("ref_log_prob",) if s.use_kl_loss else ()) if k not in data.batch.keys()]
    if missing:
        raise KeyError(f"update_actor needs {missing} in the batch")
    temperature = w._temperature(data)
    p = am.update_params(s)
    rows = len(data)
    rec = CallRecord(w, data)
    if legacy:
        mini = w.mini_legacy
        schedule = am.mini_batch_rows("legacy", rows, mini) * s.ppo_epochs
    else:
        mini = am.engine_mini(s.ppo_mini_batch_size, s.rollout_n, w.dp_size)
        schedule = engine_schedule(rows, mini, s.ppo_epochs, s.data_loader_seed + w.dp_rank, s.shuffle)
    statics = None if p.dynamic else [am.static_parts(s.profile, len(idx), p.micro) for idx in schedule]  # E30
    on_policy = legacy and len(schedule) == 1  # one mini-batch and ppo_epochs == 1
    rec.mini_batches = [len(idx) for idx in schedule[: len(schedule) // s.ppo_epochs]]
    rec.extra.update(ga_per_mini=[], loss_scale_per_micro=[], on_policy=on_policy, optimizer_steps=len(schedule))
    calc_entropy = s.calculate_entropy or s.entropy_coeff != 0
    metrics: dict[str, Any] = {"actor/pg_loss": 0.0, "actor/kl_loss": 0.0} if legacy else {}
    w.model.train()
    for j, idx in enumerate(schedule):
        sub = data.select_idxs(idx)
        total_tokens = None
        if not legacy:  # train_mini_batch: row lengths gathered for MFU, then forward_backward_batch's token sum
            global_token_num(w, rec, sub.batch["attention_mask"].sum(-1).tolist())
            total_tokens = w._batch_num_tokens(rec, sub, p.budget * sp if p.dynamic else None)
        parts = w._dynamic_parts(rec, sub, p.budget * sp) if p.dynamic else statics[j]
        parts = [[idx[i] for i in part] for part in parts]  # positions in the rank's rows
        rec.extra["ga_per_mini"].append(len(parts))
        info = am.global_batch_info(
            s.profile, w.dp_size, total_tokens, s.ppo_mini_batch_size * s.rollout_n, s.loss_scale_factor
        )
        w.optimizer.zero_grad()
        mini_metrics: dict[str, list] = {}
        mini_loss = 0.0
        for i, part in enumerate(parts):
            synced = legacy or i == len(parts) - 1
            if not legacy:
                w.model.set_requires_gradient_sync(synced)  # 0.9.1: no_sync except on the last micro-batch
            scale = 1.0
            if legacy:
                kind = "dynamic" if p.dynamic else "static"
                ga = None if p.dynamic else mini // p.micro  # GA = M′ // m
                scale = micro_batch_loss_scale("legacy", kind, len(part), mini, ga)
            rec.extra["loss_scale_per_micro"].append(scale)
            with dist.where("update_actor", i):  # labels this micro-batch's guarded collectives (hang report)
                loss, m = _micro_loss(w, rec, data, part, temperature, calc_entropy, on_policy, info)
                mini_loss += loss.detach().item()
                before = dist.collective_counts()
                (loss * scale).backward()
                rec.backward(before, sp, synced)
            if legacy:
                metrics["actor/pg_loss"] += m.pop("pg_loss") * scale
                metrics["actor/kl_loss"] += m.pop("kl_loss", 0.0) * scale
                for k, v in m.items():
                    metrics.setdefault(k, []).append(v)
            else:
                for k, v in m.items():
                    mini_metrics.setdefault("actor/" + k if not k.startswith("actor/") else k, []).append(v)
        if not legacy:
            w.model.set_requires_gradient_sync(True)
        grad_norm = optimizer_step(w, rec)
        if legacy:
            metrics.setdefault("actor/grad_norm", []).append(grad_norm)
        else:
            for k, v in mini_metrics.items():
                metrics.setdefault(k, []).append(v)
            metrics.setdefault("actor/grad_norm", []).append(grad_norm)
            # engine_workers._postprocess_output: loss = Σ micro-batch losses of the mini-batch (each the full
            # ppo_loss, global denominators), AVG-all-reduced over DP; the metrics are gathered over DP
            metrics.setdefault("actor/loss", []).append(postprocess(w, rec, mini_loss, mini_metrics))
    w.optimizer.zero_grad()
    metrics["actor/lr"] = s.lr if legacy else [s.lr] * len(schedule)
    w.records.append(rec.finish())
    return DataProto.from_dict(meta_info={"metrics": metrics})


def _v1_horizon(info: dict, data: DataProto, batch: dict, loss_agg_mode: str) -> dict:
    """v1 loop (driver sets meta_info["loss_horizon"] = "micro_batch"): seq-mean-token-sum-norm without
    loss_scale_factor divides by the micro-batch's longest response (v1's nested responses padded to their longest,
    a padding row's 1 token included), not by response_length. Mirrors core_algos.agg_loss on v1's data."""
    if data.meta_info.get("loss_horizon") != "micro_batch" or loss_agg_mode != "seq-mean-token-sum-norm":
        return info
    if info.get("loss_scale_factor") is not None:
        return info
    width = batch["responses"].shape[1]
    return {**info, "loss_scale_factor": int(batch["attention_mask"][:, -width:].sum(-1).max())}


def _micro_loss(
    w: Any,
    rec: CallRecord,
    data: DataProto,
    part: list[int],
    temperature: float,
    calc_entropy: bool,
    on_policy: bool,
    info: dict,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Forward one micro-batch with grads and build the PPO loss (+ entropy bonus, + KL to the reference)."""
    s, sp = w.s, w.s.ulysses_sequence_parallel_size
    rows = torch.as_tensor(part, dtype=torch.long)
    batch = {k: v[rows].to(w.device) for k, v in data.batch.items()}
    rec.micro(part, batch["attention_mask"], w._rmpad(), sp, w._pad_to_longest())
    before = dist.collective_counts()
    log_prob, entropy = forward_micro_batch(
        w.model,
        batch,
        use_remove_padding=w._rmpad(),
        sp_group=w.sp_group if sp > 1 else None,
        temperature=temperature,
        calculate_entropy=calc_entropy,
        chunked=s.chunked_logprob,
        pad_to_longest=w._pad_to_longest(),
    )
    rec.forward(before, sp)
    mask = batch["response_mask"]
    info = _v1_horizon(info, data, batch, s.loss_agg_mode)
    old = log_prob.detach() if on_policy else batch["old_log_probs"]
    pg_loss, pg_metrics = policy_loss_vanilla(
        old,
        log_prob,
        batch["advantages"],
        mask,
        loss_agg_mode=s.loss_agg_mode,
        clip_ratio=s.clip_ratio,
        clip_ratio_low=s.clip_ratio_low,
        clip_ratio_high=s.clip_ratio_high,
        clip_ratio_c=s.clip_ratio_c,
        profile=s.profile,
        global_batch_info=info,
    )
    out: dict[str, float] = dict(pg_metrics)
    out["pg_loss"] = pg_loss.detach().item()
    policy_loss = pg_loss
    legacy = s.profile == "legacy"
    if entropy is not None:
        ent = agg_loss(entropy, mask, s.loss_agg_mode, profile=s.profile, **info)
        out["actor/entropy" if legacy else "entropy_loss"] = ent.detach().item()
        if s.entropy_coeff != 0:
            policy_loss = policy_loss - ent * s.entropy_coeff
            if legacy:
                # verl 0.7.1 dp_actor.update_policy quirk: `policy_loss = pg_loss; policy_loss -= entropy_agg *
                # entropy_coeff` subtracts IN PLACE on the pg_loss tensor, so the logged actor/pg_loss already holds
                # −entropy_coeff·entropy. 0.9.1 losses.ppo_loss logs pg_loss (Metric → .item()) before subtracting.
                out["pg_loss"] = policy_loss.detach().item()
    if s.use_kl_loss:
        kld = kl_penalty(log_prob, batch["ref_log_prob"], s.kl_loss_type, profile=s.profile)
        kl = agg_loss(kld, mask, s.loss_agg_mode, profile=s.profile, **info)
        policy_loss = policy_loss + kl * s.kl_loss_coef
        out["kl_loss"] = kl.detach().item()
        out["actor/kl_coef"] = s.kl_loss_coef
    if not legacy:
        out = {("actor/" + k if not k.startswith("actor/") else k): v for k, v in out.items()}
    return policy_loss, out
