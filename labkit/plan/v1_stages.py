"""Planner stages of verl 0.9.1's v1 loop (``trainer.use_v1=true``, sync mode) before the forward passes: the
agent-loop split of the B prompts, generation, the replay buffer's completion order, the synthetic padding rows,
the always-on ``_balance_batch`` and the advantage. The forward passes and updates reuse ``train_stages`` on the
padded batch. Mirrors verl/trainer/ppo/v1/trainer_base.py: PPOTrainer._step_once.
"""

from __future__ import annotations

from collections.abc import Sequence

from labkit.balance.balance_batch import log_seqlen_unbalance, v1_partitions
from labkit.plan.context import Ctx
from labkit.rules.catalogue import entry
from labkit.rules.failures import StageFailure
from labkit.rules.geometry import ARR
from labkit.rules.v1_loop import agent_loop_split, completion_keys
from labkit.trace import RankRecord, StageRecord, StepTrace

BASE = "verl/trainer/ppo/v1/trainer_base.py: PPOTrainer"


def arrange_rows(ctx: Ctx, lengths: list[int] | None, completion_order: Sequence[int] | None) -> None:
    """The v1 batch before balancing: the surviving trajectories in completion order, then the padding rows (128
    tokens each). ``completion_order`` lists trajectory indices (prompt-major, ``p·n + session``) in the order they
    finished, the failed ones left out; None plans them in submission order. Fills ``ctx.rows`` and
    ``ctx.lengths``."""
    n, B = ctx.geo.rollout_n, ctx.geo.prompts
    keys = completion_keys([n] * B)
    failed = set(ctx.geo.failed_sessions)
    alive = [i for i in range(len(keys)) if i not in failed]
    order = alive if completion_order is None else [int(i) for i in completion_order]
    if sorted(order) != alive:
        raise ValueError(
            f"completion_order must list each of the {len(alive)} surviving trajectory indices (0..B·n-1 less the "
            "failed sessions) once"
        )
    ctx.rows = [keys[i] for i in order] + [None] * ctx.geo.padding_rows
    ctx.cache["completion_order"] = order
    if lengths is not None:
        ctx.lengths = [lengths[i] for i in order] + [ctx.geo.padding_row_tokens] * ctx.geo.padding_rows
        ctx.__post_init__()


def dataloader(ctx: Ctx, tr: StepTrace) -> None:
    """B = data.train_batch_size prompts, fetched in train_batch_size / gen_batch_size dataloader batches."""
    gen = ctx.get("data.gen_batch_size") or ctx.geo.prompts
    tr.stages.append(
        StageRecord(
            "dataloader",
            "dataloader batch",
            ctx.geo.prompts,
            "prompts",
            None,
            f"B = data.train_batch_size = {ctx.geo.prompts}, in {ctx.geo.prompts // gen if gen else 0} fetch(es) of "
            f"gen_batch_size = {gen}",
            ["data.train_batch_size", "data.gen_batch_size"],
            f"{BASE}._next_train_batch",
            "driver; a fresh uid per prompt; no repeat on the driver: each prompt's n sessions start in its worker",
        )
    )


def agent_loop(ctx: Ctx, tr: StepTrace) -> None:
    """``TensorDict.chunk(A)`` of the B prompts (uneven allowed); each prompt starts its n sessions in one worker."""
    split = agent_loop_split(ctx.geo.prompts, ctx.geo.agent_workers)
    n = ctx.geo.rollout_n
    rec = StageRecord(
        "agent_loop",
        "agent-loop split",
        ctx.geo.prompts,
        "prompts",
        split[0] if len(set(split)) == 1 else None,
        f"chunk(B = {ctx.geo.prompts}, A = {ctx.geo.agent_workers}) → {','.join(map(str, split))} prompts "
        f"= {','.join(str(k * n) for k in split)} sessions (× n = {n})",
        [f"{ARR}.rollout.agent.num_workers", f"{ARR}.rollout.n"],
        "verl/trainer/ppo/v1/agent_loop_tq.py: AgentLoopManagerTQ.generate_sequences",
        f"{len(split)} of {ctx.geo.agent_workers} workers get prompts; a prompt's n sessions stay in one worker; "
        "no divisibility error (no E26)",
    )
    tr.stages.append(rec)
    tr.summary["agent_loop"] = {
        "A": ctx.geo.agent_workers,
        "prompts_per_worker": split,
        "sessions_per_worker": [k * n for k in split],
        "per_worker": rec.per_rank_rows,
        "condition": "uneven split allowed (TensorDict.chunk)",
        "ok": True,
    }


def generate(ctx: Ctx, tr: StepTrace) -> None:
    """B·n sessions routed to the R rollout replicas by the least-in-flight balancer: no fixed per-rank partition."""
    R = ctx.geo.rollout_replicas
    tr.stages.append(
        StageRecord(
            "generate",
            "generation",
            ctx.geo.generated_samples,
            "samples",
            None,
            f"B·n = {ctx.geo.prompts}·{ctx.geo.rollout_n} = {ctx.geo.generated_samples} sessions over R = {R} replicas"
            + (f" (≈ {ctx.geo.generated_samples / R:g} each)" if R else ""),
            [f"{ARR}.rollout.tensor_model_parallel_size", f"{ARR}.rollout.n"],
            "verl/trainer/ppo/v1/agent_loop_tq.py: AgentLoopWorkerTQ._run_prompt",
            "each trajectory is scored in the agent loop and put into TransferQueue unpadded when it finishes",
        )
    )


def replay_buffer(ctx: Ctx, tr: StepTrace) -> None:
    """The sync ReplayBuffer returns every surviving trajectory of the B groups in TransferQueue registration order;
    a group whose sessions partly failed keeps its survivors; no survivor at all is E49."""
    order = ctx.cache.get("completion_order") or []
    assumed = order == sorted(order)
    failed, alive = len(ctx.geo.failed_sessions), ctx.geo.survivors
    how = f"{ctx.geo.prompts} terminal groups → {alive} rows in completion order"
    if failed:
        how += f" ({failed} failed session(s) wrote no row; their groups keep their survivors)"
    rec = StageRecord(
        "replay_buffer",
        "replay buffer (completion order)",
        alive,
        "samples",
        None,
        how,
        ["trainer.v1.trainer_mode"],
        "verl/trainer/ppo/v1/replay_buffer.py: ReplayBuffer.sample",
        ("completion order assumed = submission order (prompt-major); " if assumed else "observed completion order; ")
        + "rows are not interleaved by the driver; polled every 2 s",
    )
    rec.extra = {"rows": [list(k) if k else None for k in ctx.rows[:alive]]}
    tr.stages.append(rec)
    if alive == 0:
        raise StageFailure("E49", "RuntimeError", entry("E49").also[0])


def padding(ctx: Ctx, tr: StepTrace) -> None:
    """Synthetic rows up to a multiple of lcm(D, critic M·n, actor M·n): 128 eos tokens, loss mask 0, own uid."""
    if not ctx.geo.dp_size:
        tr.stages.append(StageRecord("padding", "synthetic padding rows", ctx.geo.generated_samples, "samples"))
        raise ctx.mesh_failure()
    X, L, pad = ctx.geo.survivors, ctx.geo.required_multiple, ctx.geo.padding_rows
    tr.stages.append(
        StageRecord(
            "padding",
            "synthetic padding rows",
            ctx.geo.samples,
            "samples",
            None,
            f"required multiple = {L}; pad = -{X} % {L} = {pad} → N′ = {ctx.geo.samples}",
            [f"{ARR}.actor.ppo_mini_batch_size", "critic.ppo_mini_batch_size", "trainer.critic_warmup"],
            "verl/trainer/ppo/padding_utils.py: upsample_batch_to_divisible_size",
            f"each padding row: {ctx.geo.padding_row_tokens - 1} prompt + 1 response eos tokens, response/loss mask 0, "
            "reward 0, advantage 0; counted in global_seqlen/*, perf/total_num_tokens and every forward/backward"
            if pad
            else "no padding: B·n is already a multiple",
        )
    )
    tr.summary["v1_padding"] = {"required_multiple": L, "padding_rows": pad, "rows": ctx.geo.samples}


def balance(ctx: Ctx, tr: StepTrace) -> None:
    """Always-on ``_balance_batch``: equal-size KK into D partitions, each kept in ascending batch index (completion
    order, padding last); ``trainer.balance_batch`` is not read. Metrics on the padded, pre-reorder batch."""
    D, N = ctx.geo.dp_size, ctx.geo.samples
    if not D:
        tr.stages.append(StageRecord("balance", "_balance_batch (always)", N, "samples"))
        raise ctx.mesh_failure()
    size = N // D
    rec = StageRecord(
        "balance",
        "_balance_batch (always)",
        N,
        "samples",
        size,
        f"k = D = {D}; N′/D = {N}/{D} = {size}",
        ["trainer.balance_batch", f"{ARR}.actor.ulysses_sequence_parallel_size"],
        f"{BASE}._balance_batch",
        "KK over workloads 24576·L + L² (equal_size); rows inside a rank in completion order (no re-sort)"
        + (
            "; trainer.balance_batch=false is ignored (verl issue #7758)"
            if not ctx.get("trainer.balance_batch")
            else ""
        )
        + ("" if ctx.lengths is not None else "; no lengths given: tokens not predicted, order = identity"),
    )
    tr.stages.append(rec)
    chunks = [list(range(r * size, (r + 1) * size)) for r in range(D)]
    if ctx.lengths is not None:
        ctx.order = v1_partitions(ctx.lengths, D)
        tr.summary["global_seqlen"] = log_seqlen_unbalance(ctx.lengths, ctx.order, "global_seqlen")
    else:
        ctx.order = chunks
    pads_of: dict[int, int] = {}
    for rank in range(ctx.geo.world_size):
        dp, spr = ctx.train_rank(rank, ctx.geo.ulysses_sp)
        idx = ctx.order[dp]
        if dp not in pads_of:
            pads_of[dp] = sum(1 for i in idx if ctx.rows[i] is None)
        pads = pads_of[dp]
        tr.ranks.append(
            RankRecord(
                "balance",
                rank,
                dp_rank=dp,
                sp_rank=spr,
                rows=size,
                tokens=ctx.tokens(idx),
                workload=None if ctx.lengths is None else float(ctx.workload(idx)),
                extra={"indices": idx, "tokens_before": ctx.tokens(chunks[dp]), "padding_rows": pads},
            )
        )


def reward(ctx: Ctx, tr: StepTrace) -> None:
    """Rewards are computed per trajectory in the agent loop (``rm_scores``), padding rows get 0."""
    tr.stages.append(
        StageRecord(
            "reward",
            "reward",
            ctx.geo.generated_samples,
            "samples",
            None,
            f"one score per trajectory: {ctx.geo.survivors} (+ {ctx.geo.padding_rows} padding rows at 0)",
            ["reward_model.use_reward_loop"],
            "verl/trainer/ppo/v1/agent_loop_tq.py: AgentLoopWorkerTQ._agent_loop_postprocess",
            "streaming, before the replay buffer; a colocated reward model runs after sampling instead",
        )
    )


def advantage(ctx: Ctx, tr: StepTrace) -> None:
    """GRPO over the last output of each session, grouped by uid; the padding rows form one group of their own."""
    est = ctx.get("algorithm.adv_estimator")
    pad = ctx.geo.padding_rows
    tr.stages.append(
        StageRecord(
            "advantage",
            "advantage (driver)",
            ctx.geo.samples,
            "samples",
            None,
            f"{ctx.geo.prompts} groups × {ctx.geo.rollout_n} sessions ({est})"
            + (f" + 1 padding group of {pad} rows (advantage 0)" if pad else ""),
            ["algorithm.adv_estimator"],
            "verl/trainer/ppo/v1/utils.py: compute_advantage_for_multi_trajectories",
            "driver; fields read back from TransferQueue, padded to the batch's longest row",
        )
    )
