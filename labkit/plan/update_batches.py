"""How an update (update_actor, update_critic) cuts its rows: the per-rank mini-batch size and its formula, the loss
scale of one micro-batch, v1's padding-only mini-batches, and one DP rank's micro-batches, GA and collectives over
all epochs. ``labkit.plan.train_stages.update_stage`` builds the stage from them.

Mirrors verl/workers/fsdp_workers.py (legacy mini-batch normalization), verl/workers/actor/dp_actor.py:
update_policy (legacy) and verl/workers/engine_workers.py: TrainingWorker.train_mini_batch (engine).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate

from labkit.plan.context import Ctx
from labkit.plan.micro_batches import micro_records
from labkit.plan.train_collectives import ENGINE_METRIC_COLLS, add_counts
from labkit.rules.failures import StageFailure
from labkit.rules.geometry import ARR
from labkit.rules.mini_batches import engine_mini, legacy_mini


def mini_batch_sizes(
    ctx: Ctx, name: str, sp: int, D: int, m: int | None
) -> tuple[int, str, Callable[[int], list[int]]]:
    """Per-rank mini size, its formula, and rows -> mini-batch rows per epoch.

    Legacy worker init (before any dispatch): M′ = (M·n)//(W//sp) with E20/E21/E22; engine ``train_mini_batch``
    (after dispatch): (M·n)/D with E28, then the iterator's E29.
    """
    M = ctx.get(f"{ARR}.actor.ppo_mini_batch_size" if name == "update_actor" else "critic.ppo_mini_batch_size")
    total = M * ctx.geo.rollout_n
    if ctx.profile == "legacy":
        # m == 0: a deprecated global micro size floor-divided to 0 (E11 is skipped when dynamic) -> X1
        mini = legacy_mini(M, ctx.geo.rollout_n, ctx.geo.world_size, sp, m, actor=name == "update_actor")
        text = f"M′ = (M·n)//(W//sp) = ({M}·{ctx.geo.rollout_n})//({ctx.geo.world_size}//{sp}) = {mini}"

        def legacy(rows: int) -> list[int]:
            if mini == 0:  # the critic has no E20: update_critic's DataProto.split(0) fails (after dispatch)
                raise StageFailure("X2", "ValueError", "range() arg 3 must not be zero")
            return [mini] * (rows // mini) + ([rows % mini] if rows % mini else [])

        return mini, text, legacy

    def engine(rows: int) -> list[int]:
        mini = engine_mini(M, ctx.geo.rollout_n, D, rows)
        return [mini] * (rows // mini)

    return total // D, f"mini = (M·n)/D = ({M}·{ctx.geo.rollout_n})/{D} = {total / D:g}", engine


def padding_only_minis(ctx: Ctx, chunks: list[list[int]], minis: list[int]) -> int:
    """v1: how many global mini-batches hold synthetic padding rows only on every DP rank (their loss mask sums to
    0, so token-mean is 0/0). Rows are cut into mini-batches in rank order (``make_iterator``, no shuffle)."""
    if not ctx.v1 or not ctx.geo.padding_rows or ctx.rows is None or ctx.lengths is None:
        return 0
    starts = [0, *accumulate(minis)]
    return sum(
        all(all(ctx.rows[i] is None for i in c[starts[j] : starts[j + 1]]) for c in chunks) for j in range(len(minis))
    )


def loss_scale(ctx: Ctx, name: str, D: int, mini: int, ga: int | None, dyn: bool) -> str:
    """How one micro-batch's loss is scaled: legacy 1/GA or rows/M′; engine global denominators × D."""
    if ctx.profile == "legacy":
        return f"1/GA = 1/{ga}" if not dyn else f"rows_in_micro/M′ = rows/{mini}"
    mode = ctx.get(f"{ARR}.actor.loss_agg_mode" if name == "update_actor" else "critic.loss_agg_mode")
    pad = ctx.v1 and ctx.geo.padding_rows > 0
    if mode == "token-mean":
        return f"global token mean: Σℓ × D / T_mini = Σℓ × {D} / (mini-batch loss tokens over all DP ranks)" + (
            " (v1 padding rows: loss mask 0, not in T_mini)" if pad else ""
        )
    if mode == "token-sum":
        return f"Σℓ × D = Σℓ × {D}"
    tail = ""
    if mode == "seq-mean-token-sum-norm":
        factor = ctx.get(f"{ARR}.actor.loss_scale_factor") if name == "update_actor" else None
        if factor:
            tail = f" / loss_scale_factor {factor}"
        elif ctx.v1:  # v1's rows are nested: the padded loss mask is as wide as the micro-batch's longest response
            tail = " / (the micro-batch's longest response: v1 rows are unpadded)"
        else:
            tail = f" / response_length {ctx.geo.response_length}"
    fixed = " (v1 padding rows counted: M·n is fixed)" if pad else ""
    return f"{mode}: Σ_seq / (M·n) × D = Σ_seq / {mini * D} × {D}{tail}{fixed}"


def update_rank(
    ctx: Ctx,
    dp: int,
    rows_idx: list[int],
    per_mini: list,
    starts: list[int],
    minis: list[int],
    sp: int,
    rmpad: bool,
    mini: int,
    m: int | None,
    dyn: bool,
    epochs: int,
    megatron: bool = False,
) -> tuple[list, list, list, dict]:
    """One DP rank's update: micro-batches over all epochs, GA per mini-batch, loss scale per micro, collectives
    (per rank, and per micro-batch: its forward and backward)."""
    micro_epoch, ga_epoch, scales, coll, per_micro = [], [], [], {}, []
    legacy = ctx.profile == "legacy"
    for j, (parts, sync) in enumerate(per_mini):
        if parts is None:
            continue
        idx = rows_idx[starts[j] : starts[j] + minis[j]]
        micro, _ = micro_records(ctx, idx, parts[dp], sp, rmpad)
        micro_epoch.extend(micro)
        ga_epoch.append(len(micro))
        if legacy:
            scales.extend(f"1/{mini // m}" if not dyn else f"{x.rows}/{mini}" for x in micro)
        add_counts(coll, sync)
        if not legacy:
            add_counts(coll, {"all_reduce(sum):batch_num_tokens": 1, "all_gather_object(global_token_num)": 1})
            add_counts(coll, ENGINE_METRIC_COLLS)
        n = len(micro)
        if megatron:  # the pass collectives are the rank's stage's (added per rank by update_stage)
            continue
        add_counts(
            coll,
            {
                "all_gather(params)": n,
                "all_gather(params):backward": n,
                "reduce_scatter(grads)": n if legacy else 1,
                "all_reduce(sum):grad_norm": 1,
            },
        )
        if sp > 1:
            add_counts(
                coll, {"all_to_all(ulysses)": n, "all_to_all(ulysses):backward": n, "all_gather(ulysses_outputs)": n}
            )
        for i in range(n):  # legacy syncs gradients after every micro-batch, engine only after the last (no_sync)
            one = {"all_gather(params)": 1, "all_gather(params):backward": 1}
            if legacy or i == n - 1:
                one["reduce_scatter(grads)"] = 1
            if sp > 1:
                one.update(
                    {"all_to_all(ulysses)": 1, "all_gather(ulysses_outputs)": 1, "all_to_all(ulysses):backward": 1}
                )
            per_micro.append(one)
    coll = {k: v * epochs for k, v in coll.items()}
    return micro_epoch * epochs, ga_epoch * epochs, scales * epochs, coll, per_micro * epochs
