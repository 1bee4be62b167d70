"""Planner stages before the actor's forward passes: dataloader, repeat, agent-loop split, generation (rollout mesh
and the two dispatch variants), ``_balance_batch``, reward and advantage. The first stages of
docs/pipeline.md; each builder appends one StageRecord (and per-rank RankRecords) to the trace.
"""

from __future__ import annotations

from functools import lru_cache

from labkit.balance.balance_batch import balance_batch
from labkit.plan.context import Ctx, rollout_layout
from labkit.rules.failures import StageFailure, fail_chunk
from labkit.rules.geometry import ARR
from labkit.trace import RankRecord, StageRecord, StepTrace

FIT = "verl/trainer/ppo/ray_trainer.py: RayPPOTrainer.fit"


def dataloader(ctx: Ctx, tr: StepTrace) -> None:
    """Row 1: B prompts per step (``drop_last=True``; ``data.gen_batch_size`` overrides ``train_batch_size``)."""
    tr.stages.append(
        StageRecord(
            "dataloader",
            "dataloader batch",
            ctx.geo.prompts,
            "prompts",
            None,
            "B = data.gen_batch_size or data.train_batch_size",
            ["data.train_batch_size", "data.gen_batch_size"],
            "verl/trainer/ppo/ray_trainer.py: RayPPOTrainer._create_dataloader",
            "driver; a fresh uid per prompt is attached before repetition",
        )
    )


def repeat(ctx: Ctx, tr: StepTrace) -> None:
    """Row 2: ``gen_batch.repeat(n, interleave=True)`` on the driver: the n samples of a prompt are adjacent."""
    tr.stages.append(
        StageRecord(
            "repeat",
            "repeat for generation",
            ctx.geo.samples,
            "samples",
            None,
            f"B·n = {ctx.geo.prompts}·{ctx.geo.rollout_n} = {ctx.geo.samples} (interleaved)",
            [f"{ARR}.rollout.n"],
            FIT,
            "driver; rows of one prompt adjacent (a,a,…,b,b,…); ≤v0.4.1 the rollout repeated",
        )
    )


def agent_loop(ctx: Ctx, tr: StepTrace) -> None:
    """Row 3: ``AgentLoopManager.generate_sequences`` chunks B·n rows over A CPU agent-loop workers (E26 if uneven)."""
    ok = ctx.geo.samples % ctx.geo.agent_workers == 0
    cond = f"B·n % A == 0: {ctx.geo.samples} % {ctx.geo.agent_workers} = {ctx.geo.samples % ctx.geo.agent_workers} {'✓' if ok else '✗ (E26)'}"
    rec = StageRecord(
        "agent_loop",
        "agent-loop split",
        ctx.geo.samples,
        "samples",
        ctx.geo.samples // ctx.geo.agent_workers if ok else None,
        f"B·n/A = {ctx.geo.samples}/{ctx.geo.agent_workers}"
        + (f" = {ctx.geo.samples // ctx.geo.agent_workers} per agent-loop worker" if ok else ""),
        [f"{ARR}.rollout.agent.num_workers"],
        "verl/experimental/agent_loop/agent_loop.py: AgentLoopManager.generate_sequences",
        f"{cond}; per-rank rows here are per agent-loop worker (CPU Ray actor), not per GPU",
    )
    tr.stages.append(rec)
    tr.summary["agent_loop"] = {
        "A": ctx.geo.agent_workers,
        "per_worker": rec.per_rank_rows,
        "condition": cond,
        "ok": ok,
    }
    if not ok:
        raise fail_chunk(ctx.geo.samples, ctx.geo.agent_workers)


def _routing_note(ctx: Ctx) -> str:
    per = ctx.geo.samples // ctx.geo.agent_workers if ctx.geo.samples % ctx.geo.agent_workers == 0 else None
    rr = ""
    if per is not None and ctx.geo.rollout_replicas:
        q, r = divmod(per, ctx.geo.rollout_replicas)
        rr = (
            f" (each worker: {per} requests → {q}{'–' + str(q + 1) if r else ''} per replica; "
            f"≈ {ctx.geo.samples / ctx.geo.rollout_replicas:g} per replica overall, a prompt's n samples spread over replicas)"
        )
    return (
        "0.8: each agent-loop worker round-robins its requests over the R replicas"
        + rr
        + "; 0.9.1: global least-in-flight balancer, no fixed partition. Rows below are the nd-dispatch "
        "('mesh', v0.6–0.7) or DP_COMPUTE_PROTO+all-gather ('all_gather', ≤v0.5) partition"
    )


def generate(ctx: Ctx, tr: StepTrace) -> None:
    """Row 4: per GPU rank, replica / TP-group membership from the rollout mesh and the rows each rank receives.

    dispatch="mesh": make_nd_compute_dataproto_dispatch_fn("rollout") chunks B·n by rollout dp; every TP rank of a
    group gets the same rows, outputs collected from tp_rank 0. dispatch="all_gather" (≤v0.5 DP_COMPUTE_PROTO):
    B·n/W in, all-gathered in the TP group to B·n·tp/W, outputs sliced back to B·n/W.
    """
    size = ctx.geo.infer_tp * ctx.geo.rollout_pp
    keys = [
        f"{ARR}.rollout.tensor_model_parallel_size",
        f"{ARR}.rollout.data_parallel_size",
        f"{ARR}.rollout.pipeline_model_parallel_size",
    ]
    where = "verl/workers/fsdp_workers.py: ActorRolloutRefWorker._build_rollout"
    if ctx.geo.world_size % size:
        tr.stages.append(StageRecord("generate", "generation", ctx.geo.samples, "samples", None, "", keys, where))
        raise StageFailure(
            "E23",
            "AssertionError",
            f"rollout world_size: {ctx.geo.world_size} is not divisible by infer_world_size: {size}",
        )
    R, mesh = ctx.geo.rollout_replicas, ctx.dispatch == "mesh"
    group = ctx.geo.samples // R if ctx.geo.samples % R == 0 else None
    rec = StageRecord(
        "generate",
        "generation",
        ctx.geo.samples,
        "samples",
        group,
        f"R = W/(tp·rdp·pp) = {ctx.geo.world_size}/({ctx.geo.rollout_tp}·{ctx.geo.rollout_dp}·{ctx.geo.rollout_pp}) = {R} replicas; "
        f"mesh (dp, infer_tp, infer_pp) = ({R}, {ctx.geo.infer_tp}, {ctx.geo.rollout_pp})"
        + (f"; B·n/R = {group} rows per replica" if group else ""),
        keys,
        where,
        _routing_note(ctx),
    )
    tr.stages.append(rec)
    tr.summary["rollout_mesh"] = {
        "dp": R,
        "infer_tp": ctx.geo.infer_tp,
        "infer_pp": ctx.geo.rollout_pp,
        "groups": [list(range(r * size, (r + 1) * size)) for r in range(R)],
        # ≤ v0.5 built a 2-D (dp, infer_tp) mesh; later versions add infer_pp
        "dims": ["dp", "infer_tp", "infer_pp"] if mesh else ["dp", "infer_tp"],
    }
    if mesh and ctx.geo.samples % R:  # only v0.6–0.7 chunked by rollout dp; 0.8/0.9.1 route each request, nothing fails
        rec.note = (
            f"B·n % R = {ctx.geo.samples} % {R} ≠ 0: no even per-replica partition (v0.6–0.7 nd dispatch would stop "
            f"with E26 'only support equal chunk. Got size of DataProto {ctx.geo.samples} and chunk {R}.'); "
        ) + rec.note
        return
    if not mesh and ctx.geo.samples % ctx.geo.world_size:
        raise fail_chunk(ctx.geo.samples, ctx.geo.world_size)
    per_w = ctx.geo.samples // ctx.geo.world_size if not mesh else None
    for rank in range(ctx.geo.world_size):
        dp, tp, pp = rollout_layout(rank, ctx.geo.infer_tp, ctx.geo.rollout_pp)
        idx = list(range(dp * group, (dp + 1) * group))
        extra = {
            "replica": dp,
            "pp_rank": pp,
            "is_collect": tp == 0 and pp == 0,
            "tp_group": dp,
            "row_range": [dp * group, (dp + 1) * group],
        }
        coll: dict[str, int] = {}
        if mesh:
            extra.update(rows_in=group, rows_out=group if extra["is_collect"] else 0)
        else:
            extra.update(
                rows_in=per_w, rows_gathered=group, rows_out=per_w, own_row_range=[rank * per_w, (rank + 1) * per_w]
            )
            if size > 1:
                coll["all_gather(data_proto)"] = 1
        tr.ranks.append(
            RankRecord(
                "generate",
                rank,
                dp_rank=dp,
                tp_rank=tp,
                rows=group,
                tokens=ctx.tokens(idx),
                padded_tokens=group * ctx.geo.width,
                collectives=coll,
                extra=extra,
            )
        )


def balance(ctx: Ctx, tr: StepTrace) -> None:
    """Row 5: ``_balance_batch``: equal-size KK over workloads into k = D partitions (one per actor DP rank)."""
    on = bool(ctx.get("trainer.balance_batch"))
    keys = ["trainer.balance_batch", f"{ARR}.actor.ulysses_sequence_parallel_size"]
    where = "verl/trainer/ppo/ray_trainer.py: RayPPOTrainer._balance_batch"
    if not ctx.geo.dp_size:
        tr.stages.append(
            StageRecord("balance", "union + _balance_batch", ctx.geo.samples, "samples", None, "", keys, where)
        )
        raise ctx.mesh_failure()
    D = ctx.geo.dp_size
    rec = StageRecord(
        "balance",
        "union + _balance_batch",
        ctx.geo.samples,
        "samples",
        ctx.geo.samples // D if ctx.geo.samples % D == 0 else None,
        f"k = D = W/sp = {ctx.geo.world_size}/{ctx.geo.ulysses_sp} = {D}; B·n/D = {ctx.geo.samples}/{D}"
        + (f" = {ctx.geo.samples // D}" if ctx.geo.samples % D == 0 else ""),
        keys,
        where,
        (
            "KK over workloads 24576·L + L² (equal_size), then small-large-small inside each rank"
            if on
            else "trainer.balance_batch=false: rows stay in generation order; rank r gets the r-th contiguous chunk"
        )
        + ("" if ctx.lengths is not None else "; no lengths given: tokens not predicted, order = identity"),
    )
    tr.stages.append(rec)
    if on and ctx.geo.samples < D:
        raise StageFailure("E36", "AssertionError", f"number of items:[{ctx.geo.samples}] < k_partitions:[{D}]")
    if ctx.geo.samples % D:
        if on:
            raise StageFailure("E38", "AssertionError", f"{ctx.geo.samples} % {D} != 0")
        rec.note = f"B·n % D = {ctx.geo.samples} % {D} ≠ 0: the DP dispatch of the next worker call fails; " + rec.note
        return
    size = ctx.geo.samples // D
    chunks = [list(range(r * size, (r + 1) * size)) for r in range(D)]
    if on and ctx.lengths is not None:
        partitions, metrics = _balanced(tuple(ctx.lengths), D)
        ctx.order = [list(part) for part in partitions]
        tr.summary["global_seqlen"] = dict(metrics)
    else:
        ctx.order = chunks
        if ctx.lengths is not None:  # verl logs no metrics without balancing; report the contiguous spread anyway
            sums = [ctx.tokens(c) for c in chunks]
            tr.summary["contiguous_seqlen"] = {"min": min(sums), "max": max(sums), "mean": sum(sums) / D}
    for rank in range(ctx.geo.world_size):
        dp, spr = ctx.train_rank(rank, ctx.geo.ulysses_sp)
        idx = ctx.order[dp]
        extra = {"indices": idx, "tokens_before": ctx.tokens(chunks[dp])}
        tr.ranks.append(
            RankRecord(
                "balance",
                rank,
                dp_rank=dp,
                sp_rank=spr,
                rows=size,
                tokens=ctx.tokens(idx),
                workload=None if ctx.lengths is None else float(ctx.workload(idx)),
                extra=extra,
            )
        )


@lru_cache(maxsize=8)
def _balanced(lengths: tuple[int, ...], dp_size: int) -> tuple[tuple[tuple[int, ...], ...], dict]:
    """balance_batch's rows per rank and metrics, kept for the next plans: a widget that changes a budget or a
    micro-batch size re-plans the same lengths, and _balance_batch does not depend on those (~20 ms at 16k rows)."""
    res = balance_batch(list(lengths), dp_size)
    return tuple(tuple(part) for part in res.partitions), res.metrics


def reward(ctx: Ctx, tr: StepTrace) -> None:
    """Row 6: rewards per sample, computed in the reward loop during generation (``rm_scores``)."""
    tr.stages.append(
        StageRecord(
            "reward",
            "reward",
            ctx.geo.samples,
            "samples",
            None,
            f"one score per sample: {ctx.geo.samples}",
            ["reward_model.use_reward_loop"],
            "verl/trainer/ppo/ray_trainer.py: RayPPOTrainer._compute_or_extract_reward",
            "driver / reward loop; no GPU-rank partition",
        )
    )


def advantage(ctx: Ctx, tr: StepTrace) -> None:
    """Row 10: advantage on the driver, B groups of n samples (by uid)."""
    est = ctx.get("algorithm.adv_estimator")
    tr.stages.append(
        StageRecord(
            "advantage",
            "advantage (driver)",
            ctx.geo.samples,
            "samples",
            None,
            f"{ctx.geo.prompts} groups × {ctx.geo.rollout_n} samples ({est})",
            ["algorithm.adv_estimator"],
            "verl/trainer/ppo/ray_trainer.py: compute_advantage",
            "driver; GRPO normalizes inside each uid group (unbiased std)",
        )
    )
