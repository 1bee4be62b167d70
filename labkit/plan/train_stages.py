"""Planner stages on the actor/critic meshes: old_log_prob, ref_log_prob, values (forward only) and update_actor,
update_critic (mini-batches, gradient accumulation, loss scale). Rows 7–9 and 11–12 of "Pipeline at a glance".
An update's mini-batch arithmetic and per-rank records are ``labkit.plan.update_batches``; a pass's collectives
``labkit.plan.train_collectives``.

Mirrors verl/workers/fsdp_workers.py (legacy normalization), verl/workers/actor/dp_actor.py: compute_log_prob /
update_policy (legacy) and verl/workers/engine_workers.py: TrainingWorker.train_mini_batch (engine).
"""

from __future__ import annotations

from itertools import accumulate

from labkit.plan.context import Ctx
from labkit.plan.megatron_passes import optimizer_collectives
from labkit.plan.micro_batches import (
    check_vpp_groups,
    dynamic_partitions,
    dynamic_partitions_each,
    micro_records,
    static_partitions,
)
from labkit.plan.roles import TITLES, Params, params
from labkit.plan.train_collectives import ENGINE_METRIC_COLLS, add_counts, pass_collectives
from labkit.plan.update_batches import loss_scale, mini_batch_sizes, padding_only_minis, update_rank
from labkit.rules.catalogue import message
from labkit.rules.failures import StageFailure, fail_chunk
from labkit.rules.geometry import ARR
from labkit.trace import RankRecord, StageRecord, StepTrace


def _cut(ctx: Ctx, p: Params, chunks: list[list[int]]) -> tuple[list | None, dict[str, int]]:
    """Micro-batch partitions (local positions) for each DP rank's rows, and the sync collectives per rank."""
    if p.dyn:
        if ctx.lengths is None:
            return None, {}
        return dynamic_partitions(ctx, chunks, p.budget * p.budget_sp, p.vpp_group)
    if p.micro is None:
        raise StageFailure(*p.missing)
    if p.micro == 0:  # legacy: a deprecated global size floor-divided to 0 per GPU; DataProto.split(0)
        raise StageFailure("X2", "ValueError", "range() arg 3 must not be zero")
    parts = [static_partitions(len(c), p.micro, ctx.profile) for c in chunks]
    if p.vpp_group and ctx.profile == "engine":
        check_vpp_groups(len(parts[0]), p.vpp_group)
    return parts, {}


def forward_stage(ctx: Ctx, tr: StepTrace, name: str) -> None:
    """Rows 7–9: every SP rank of a DP group holds the same B·n/D rows, cut into static or dynamic micro-batches."""
    rec = StageRecord(name, TITLES[name], ctx.geo.samples, "samples", None, "")
    tr.stages.append(rec)
    p = params(ctx, name)
    rec.keys, rec.where = p.keys, p.where
    sp, D, rmpad, dyn, m = p.sp, p.D, p.rmpad, p.dyn, p.micro
    if (
        ctx.dispatch == "all_gather" and ctx.geo.samples % ctx.geo.world_size
    ):  # ≤v0.5 DP_COMPUTE_PROTO chunks by W before the worker runs
        raise fail_chunk(ctx.geo.samples, ctx.geo.world_size)
    chunks = ctx.dp_chunks(D)
    if not all(chunks):  # fewer rows than DP ranks (a config verl stops at start-up): no dispatch can feed them
        raise fail_chunk(ctx.geo.samples, D)
    rows = ctx.geo.samples // D
    even = all(len(c) == rows for c in chunks)  # v1's TransferQueue chunks may be uneven (k ≠ the actor's D)
    rec.per_rank_rows = rows if even else None
    parts, sync = _cut(ctx, p, chunks)
    notes = list(p.notes)
    if dyn:
        budget = p.budget * p.budget_sp
        rec.formula = (
            f"{ctx.rows_name}/D = {ctx.geo.samples}/{D} = {rows} rows; dynamic: budget = {p.budget}×sp = {budget} "
            "tokens, count synced (MAX) over the DP group"
        )
        notes.insert(
            0,
            "dynamic micro-batching needs lengths (--lengths)"
            if parts is None
            else (
                "legacy: token budget is a target, not a cap" if ctx.profile == "legacy" else "engine: hard token cap"
            ),
        )
    else:
        sizes = [len(x) for x in parts[0]]
        how = "split" if ctx.profile == "legacy" else "chunk"
        rec.formula = (
            f"{ctx.rows_name}/D = {ctx.geo.samples}/{D} = {rows} rows; static {how}({m}) → {len(sizes)} micro-batches of "
            f"{sizes[0]}" + (f" (last {sizes[-1]})" if sizes[-1] != sizes[0] else "")
        )
    rec.note = "; ".join(notes)
    per_dp: dict[int, tuple] = {}
    for rank in range(ctx.geo.world_size):
        dp, spr = ctx.train_rank(rank, sp)
        idx = chunks[dp]
        if dp not in per_dp:  # every SP rank of a DP group holds the same rows (records shared)
            per_dp[dp] = ([], None) if parts is None else micro_records(ctx, idx, parts[dp], p.slice_sp, rmpad)
        micro, per_sp = per_dp[dp]
        coll: dict[str, int] = {}
        extra: dict = {"dynamic": dyn}
        if ctx.dispatch == "all_gather":
            extra["rows_in"] = ctx.geo.samples // ctx.geo.world_size
            if sp > 1:
                coll["all_gather(data_proto)"] = 1
        if parts is not None:
            add_counts(coll, sync)
            if ctx.profile == "engine":
                coll["all_reduce(sum):batch_num_tokens"] = 1
            one = pass_collectives(ctx, p, rank)
            add_counts(coll, one, len(micro))
            if ctx.profile == "engine":
                add_counts(coll, ENGINE_METRIC_COLLS)
        if per_sp is not None:
            extra["tokens_per_gpu" if p.megatron else "tokens_per_sp_rank"] = per_sp
        extra.update(ctx.megatron_extra(rank))
        if micro and parts is not None:  # each micro-batch's own collectives (its forward)
            extra["micro_collectives"] = [one] * len(micro)  # one shared dict (read-only)
        padded = [x.padded_tokens for x in micro]
        tr.ranks.append(
            RankRecord(
                name,
                rank,
                dp_rank=dp,
                sp_rank=spr,
                rows=len(idx),
                tokens=ctx.tokens(idx),
                padded_tokens=sum(padded) if micro and None not in padded else None,
                workload=sum(x.workload for x in micro) if micro and ctx.lengths is not None else None,
                micro_batches=list(micro),
                collectives=coll,
                extra=extra,
            )
        )


def update_stage(ctx: Ctx, tr: StepTrace, name: str) -> None:
    """Rows 11–12: mini-batches per epoch, micro-batches (GA) per mini-batch, optimizer steps, loss scale,
    collectives."""
    epochs = ctx.get(f"{ARR}.actor.ppo_epochs" if name == "update_actor" else "critic.ppo_epochs")
    rec = StageRecord(name, TITLES[name], ctx.geo.samples, "samples", None, "")
    tr.stages.append(rec)
    p = params(ctx, name)
    rec.keys, rec.where = p.keys + ["ppo_mini_batch_size", "ppo_epochs"], p.where
    sp, D, rmpad, dyn, m = p.sp, p.D, p.rmpad, p.dyn, p.micro
    mini, text, split = mini_batch_sizes(ctx, name, sp, D, m)  # legacy asserts at worker init, before any dispatch
    if ctx.dispatch == "all_gather" and ctx.geo.samples % ctx.geo.world_size:  # ≤v0.5 DP_COMPUTE_PROTO chunks by W
        raise fail_chunk(ctx.geo.samples, ctx.geo.world_size)
    chunks = ctx.dp_chunks(D)
    if not all(chunks):  # fewer rows than DP ranks, as in forward_stage
        raise fail_chunk(ctx.geo.samples, D)
    rows = ctx.geo.samples // D
    rec.per_rank_rows = rows
    minis = split(rows)
    starts = [0, *accumulate(minis)][:-1]  # row offset of each mini-batch
    subs = [[c[starts[j] : starts[j] + size] for c in chunks] for j, size in enumerate(minis)]
    if p.dyn and ctx.lengths is not None:  # per mini-batch j: (partitions per DP rank, sync collectives)
        per_mini = dynamic_partitions_each(ctx, subs, p.budget * p.budget_sp, p.vpp_group)
    else:
        per_mini = [_cut(ctx, p, sub) for sub in subs]
    run = None if dyn else len(per_mini[0][0][0])  # micro-batches rank 0 runs in its first mini-batch
    # verl's GA: legacy dp_actor's gradient_accumulation = M′ // m (the loss scale 1/GA), even when a rank holds
    # fewer than M′ rows and runs fewer micro-batches; the engine has no GA variable, so GA = the micro-batches run
    ga = None if dyn else (mini // m if ctx.profile == "legacy" and m else run)
    steps = epochs * len(minis)
    scale = loss_scale(ctx, name, D, mini, ga, dyn)
    ga_text = f"GA = {mini}/{m} = {ga}" if ctx.profile == "legacy" else f"GA = micro-batches per mini-batch = {ga}"
    if not dyn and run != ga:
        ga_text += f" (micro-batches run: {run}, the rank holds fewer rows than M′)"
    rec.formula = (
        f"{text}; {len(minis)} mini-batch(es)/epoch {minis}; "
        + (ga_text if not dyn else "GA = dynamic micro count")
        + f"; optimizer steps = ppo_epochs × mini-batches = {epochs} × {len(minis)} = {steps}"
    )
    notes = [f"loss scale: {scale}"] + p.notes
    if p.megatron:
        notes.append("Megatron: each micro-batch loss × its micro-batch count (the mcore schedule divides by it)")
    if ctx.profile == "legacy" and len(minis) == 1 and epochs == 1 and name == "update_actor":
        notes.append("on-policy shortcut: old_log_prob replaced by the current forward (ratio ≡ 1)")
    if ctx.profile == "legacy" and minis[-1] != minis[0]:
        notes.append(f"ragged last mini-batch of {minis[-1]} rows, no error in legacy")
    if ctx.profile == "engine" and ctx.get(f"{ARR}.actor.shuffle") and name == "update_actor":
        notes.append("actor.shuffle=true: mini-batch membership is shuffled; tokens shown are for unshuffled order")
    if dyn and ctx.lengths is None:
        notes.append("dynamic micro-batching needs lengths (--lengths)")
    empty = padding_only_minis(ctx, chunks, minis)
    if empty:
        role = "actor" if name == "update_actor" else "critic"
        notes.append(f"{message('S6', role=role, count=empty, total=len(minis))} (S6)")
        tr.summary.setdefault("padding_only_mini_batches", {})[name] = empty
    rec.note = "; ".join(notes)
    tr.summary.setdefault("update", {})[name] = {
        "mini_normalized": mini,
        "mini_batches": minis,
        "ga": ga,
        "micro_batches_run": run,
        "epochs": epochs,
        "optimizer_steps": steps,
        "loss_scale": scale,
        "mini_formula": text,
    }
    per_dp: dict[int, tuple] = {}
    for rank in range(ctx.geo.world_size):
        dp, spr = ctx.train_rank(rank, sp)
        if dp not in per_dp:
            per_dp[dp] = update_rank(
                ctx, dp, chunks[dp], per_mini, starts, minis, sp, rmpad, mini, m, dyn, epochs, p.megatron
            )
        micro_all, ga_list, scales, coll, per_micro = per_dp[dp]
        coll = dict(coll)
        if p.megatron:  # Megatron's collectives depend on the rank's pipeline stage, not only on its DP rank
            one = pass_collectives(ctx, p, rank, backward=True)
            per_micro = [one] * len(micro_all)  # one shared dict per rank (read-only)
            add_counts(coll, one, len(micro_all))
            add_counts(coll, optimizer_collectives(ctx.geo.parallel), steps)
        if ctx.dispatch == "all_gather" and sp > 1:
            coll["all_gather(data_proto)"] = 1
        extra = {"ga_per_mini": ga_list, "optimizer_steps": steps, "epochs": epochs, "dynamic": dyn}
        extra.update(ctx.megatron_extra(rank))
        if per_micro:
            extra["micro_collectives"] = per_micro
        if scales:
            extra["loss_scale_per_micro"] = scales
        padded = [x.padded_tokens for x in micro_all]
        tr.ranks.append(
            RankRecord(
                name,
                rank,
                dp_rank=dp,
                sp_rank=spr,
                rows=rows,
                tokens=ctx.tokens(chunks[dp]),
                micro_batches=list(micro_all),
                padded_tokens=sum(padded) if micro_all and None not in padded else None,
                workload=sum(x.workload for x in micro_all) if micro_all and ctx.lengths is not None else None,
                mini_batches=list(minis),
                collectives=coll,
                extra=extra,
            )
        )


def no_update(ctx: Ctx, tr: StepTrace) -> None:
    """update_actor at a step before ``trainer.critic_warmup``: both loops skip it (``critic_warmup <=
    global_steps`` gates the update), so it holds no rank and raises nothing."""
    warmup, step = ctx.geo.critic_warmup, ctx.geo.global_step
    tr.stages.append(
        StageRecord(
            "update_actor",
            TITLES["update_actor"],
            ctx.geo.samples,
            "samples",
            None,
            f"not run: critic_warmup = {warmup} > global step {step}",
            ["trainer.critic_warmup"],
            "verl/trainer/ppo/v1/trainer_base.py: PPOTrainer._step_once"
            if ctx.v1
            else "verl/trainer/ppo/ray_trainer.py: RayPPOTrainer.fit",
            f"the actor is first updated at step {warmup}",
        )
    )
