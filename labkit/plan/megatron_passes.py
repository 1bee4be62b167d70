"""The Megatron engine's passes in the planner: which rows a rank holds, how its micro-batches are cut and padded, and
the collectives each micro-batch issues.

verl dispatches by ``dp_rank`` (``verl/workers/engine_workers.py: TrainingWorker.__init__``), so every TP, CP and PP
rank of one DP rank holds the same rows; D = W // (TP·PP·CP) (``MegatronEngine.get_data_parallel_size``, 1 under
dynamic CP). Micro sizes are per GPU and never divided by D (engine); the token budget is multiplied by CP, not by
TP (``verl/workers/engine/megatron/transformer_impl.py: forward_backward_batch``); with virtual pipeline stages the
micro-batch count must divide by G = ``microbatch_group_size_per_vp_stage`` (``prepare_micro_batches``'s
``num_batches_divided_by``). Packed (THD) rows are padded one by one to a multiple of TP·CP·2 (CP > 1) or TP, and each
CP rank holds 1/CP of every padded row (``verl/models/mcore/util.py: preprocess_thd_engine``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from labkit.plan.pipeline_schedule import pipeline_schedule
from labkit.rules.geometry import ceil_div
from labkit.rules.megatron_ranks import MegatronRanks, megatron_ranks
from labkit.rules.parallel_layout import ParallelLayout

MICROBATCH_GROUP = "override_transformer_config.microbatch_group_size_per_vp_stage"
"""G's key under ``<role>.megatron``."""


@lru_cache(maxsize=16)
def _ranks(layout: ParallelLayout) -> MegatronRanks:
    return megatron_ranks(layout)


def megatron_coords(layout: ParallelLayout, rank: int) -> dict[str, int]:
    """A global rank's (tp, cp, dp, pp) coordinates in megatron-core's default order ``tp-cp-ep-dp-pp`` (the first
    varies fastest), plus its expert-parallel rank ``ep`` when EP > 1 (``labkit.rules.megatron_ranks``)."""
    coords = _ranks(layout).coords
    out = {k: int(coords[k][rank]) for k in ("tp", "cp", "dp", "pp")}
    if layout.ep > 1:
        out["ep"] = int(coords["ep"][rank])
    return out


def trainer_dp_rank(layout: ParallelLayout, rank: int) -> int:
    """The DP rank verl dispatches rows to: the rank's DP coordinate, or 0 for all under dynamic CP."""
    return int(_ranks(layout).data_rank[rank])


def sequence_alignment(layout: ParallelLayout) -> int:
    """What each packed row is padded to: TP·CP·2 with CP > 1 (zigzag), else TP (``preprocess_thd_engine``)."""
    return layout.tp * layout.cp * 2 if layout.cp > 1 else layout.tp


def padded_row(length: int, align: int) -> int:
    """One row's tokens after THD padding to a multiple of ``align``."""
    return ceil_div(length, align) * align


def micro_tokens_per_gpu(lengths: Sequence[int], layout: ParallelLayout) -> int:
    """Tokens one GPU feeds for a packed micro-batch: Σ pad(len, align) / CP (each CP rank holds 2 of 2·CP chunks)."""
    align = sequence_alignment(layout)
    return sum(padded_row(x, align) for x in lengths) // layout.cp


def vpp_group(layout: ParallelLayout, group_size: int | None) -> int | None:
    """G, the micro-batch count's required divisor: ``microbatch_group_size_per_vp_stage`` (None: PP) when virtual
    pipeline stages are on, else None (``TransformerConfig.__post_init__`` defaults G to PP)."""
    if not layout.vpp or layout.vpp <= 1:
        return None
    return group_size or layout.pp


def megatron_params(ctx: Any, name: str, p: Any) -> Any:
    """The stage parameters (``labkit.plan.roles.Params``) under Megatron: no Ulysses mesh, D from the layout, the
    budget × CP; legacy's deprecated global micro size floor-divided by D (``megatron_workers.py``), the engine's
    ignored (``engine_workers.py: ActorRolloutRefWorker.init_model`` reads the per-GPU keys only)."""
    layout = ctx.geo.parallel
    micro = p.micro
    critic = name in ("values", "update_critic")
    if ctx.profile == "legacy":
        micro_k, dep_k = p.keys[0], _deprecated(p.keys[0])
        dep = ctx.get(dep_k) if dep_k else None
        if dep is not None and (not ctx.cfg.is_set(micro_k) or ctx.get(micro_k) is None):
            micro = dep // max(ctx.geo.dp_size, 1)
    else:
        micro = ctx.get(p.keys[0])
    group_key = ("critic" if critic else "actor_rollout_ref.actor") + f".megatron.{MICROBATCH_GROUP}"
    notes = [n for n in p.notes if "sp=1 mesh" not in n and "ref sp" not in n]
    notes.append(
        f"Megatron: D = W/(TP·PP·CP) = {layout.world_size}/({layout.tp}·{layout.pp}·{layout.cp}) = {layout.dp_size}; "
        f"every TP/CP/PP rank of a DP rank holds its rows; budget × CP = × {layout.cp}"
    )
    return replace(
        p,
        sp=1,
        budget_sp=layout.cp,
        micro=micro,
        D=ctx.geo.dp_size,
        slice_sp=1,
        notes=notes,
        vpp_group=vpp_group(layout, ctx.get(group_key)),
        megatron=True,
    )


def _deprecated(per_gpu_key: str) -> str | None:
    """The deprecated global key beside a ``*_per_gpu`` key (``ppo_micro_batch_size`` for ``…_per_gpu``)."""
    return per_gpu_key.removesuffix("_per_gpu") if per_gpu_key.endswith("_per_gpu") else None


def forward_collectives(layout: ParallelLayout, pp_rank: int, backward: bool = False) -> dict[str, int]:
    """The collectives one micro-batch's pass issues on a rank of pipeline stage ``pp_rank`` (names in
    ``labkit.rules.collectives.COLLECTIVES``; a call made in every layer counts once per pass, as FSDP's gathers do).
    Mirrors megatron-core's column/row-parallel linears (``tensor_parallel/mappings.py``), the P2P of
    ``pipeline_parallel/p2p_communication.py`` and the CP ring of the attention."""
    suffix = ":backward" if backward else ""
    out: dict[str, int] = {}
    if layout.tp > 1:
        if layout.sequence_parallel:
            out[f"all_gather(tp_sp){suffix}"] = 1
            out[f"reduce_scatter(tp_sp){suffix}"] = 1
        else:
            out[f"all_reduce(megatron_tp){suffix}"] = 1
    if layout.cp > 1:
        out[f"ring_exchange(cp){suffix}"] = 1
    if layout.pp > 1:
        first, last = pp_rank == 0, pp_rank == layout.pp - 1
        if backward:
            if not last:
                out["recv(pp):grad"] = 1
            if not first:
                out["send(pp):grad"] = 1
        else:
            if not first:
                out["recv(pp):activation"] = 1
            if not last:
                out["send(pp):activation"] = 1
    return out


def optimizer_collectives(layout: ParallelLayout) -> dict[str, int]:
    """Per optimizer step: the DP×CP gradient reduce (reduce-scatter with the distributed optimizer, else all-reduce)
    and the parameter all-gather after the step (``megatron/core/distributed/param_and_grad_buffer.py``)."""
    if layout.dp_size * layout.cp <= 1:
        return {"all_reduce(sum):grad_norm": 1}
    if layout.use_distributed_optimizer:
        return {"reduce_scatter(dp_cp):grads": 1, "all_gather(dp_cp):params": 1, "all_reduce(sum):grad_norm": 1}
    return {"all_reduce(dp_cp):grads": 1, "all_reduce(sum):grad_norm": 1}


def megatron_summary(layout: ParallelLayout) -> dict[str, Any]:
    """The layout's sizes for a plan's summary: TP, PP, VPP, CP, EP, ETP, D, expert DP, SP and the optimizer."""
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "vpp": layout.vpp,
        "cp": layout.cp,
        "ep": layout.ep,
        "etp": layout.etp,
        "dp": layout.dp_size,
        "expert_dp": layout.expert_dp_size,
        "sequence_parallel": layout.sequence_parallel,
        "distributed_optimizer": layout.use_distributed_optimizer,
        "dynamic_context_parallel": layout.dynamic_context_parallel,
    }


def layout_groups(layout: ParallelLayout) -> dict[str, Any]:
    """The layout's groups for a plan's summary (``labkit.rules.megatron_ranks``): the ranks that receive each DP
    rank's rows, the ranks verl collects outputs from, and the first group of each kind."""
    ranks = _ranks(layout)
    dp = max(layout.trainer_dp_size, 1)
    return {
        "same_rows": {d: ranks.same_rows(d) for d in range(min(dp, 8))},
        "output_ranks": [int(r) for r in ranks.output_ranks],
        "first_groups": {kind: ranks.group_of(kind, 0) for kind in ("tp", "cp", "dp", "pp", "dp-cp")},
    }


def update_schedule(layout: ParallelLayout, micro_batches: int, group: int | None) -> dict[str, Any]:
    """The update's pipeline schedule on every stage for ``micro_batches`` micro-batches per mini-batch
    (``labkit.plan.pipeline_schedule``): megatron-core's function, warm-up/steady/cool-down counts, the micro-batches
    in flight at each stage's peak and the bubble of the timeline; or the schedule check that fails."""
    try:
        sched = pipeline_schedule(layout.pp, layout.vpp, micro_batches, group)
    except ValueError as exc:
        return {"error": str(exc)}
    return {
        "function": sched.function,
        "micro_batches": micro_batches,
        "group_size": sched.group_size,
        "bubble_fraction": round(sched.bubble_fraction, 4),
        "stages": [
            {
                "stage": st.stage,
                "warmup": st.warmup,
                "steady": st.steady,
                "cooldown": st.cooldown,
                "peak_in_flight": st.peak_in_flight,
            }
            for st in sched.stages
        ],
    }
