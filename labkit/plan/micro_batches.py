"""Micro-batches of one DP rank's rows for the planner: static (legacy ``split``, engine ``chunk``) or dynamic
(token budget, micro-batch count synced over the DP group), with tokens, padded tokens and workload per micro-batch.

Mirrors verl/workers/actor/dp_actor.py (legacy ``split``/``prepare_dynamic_batch``) and verl/workers/engine/utils.py:
prepare_micro_batches (engine); the dynamic partition itself comes from ``labkit.balance.micro_batches``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from labkit.balance.micro_batches import plan_dp_micro_batches_each, static_micro_batches
from labkit.plan.context import Ctx
from labkit.plan.megatron_passes import padded_row, sequence_alignment
from labkit.rules.catalogue import code_of, message
from labkit.rules.failures import StageFailure
from labkit.rules.geometry import ulysses_padded
from labkit.trace import MicroBatchRecord

_CODES = ("E27", "E30", "E31", "E33", "E34", "E35", "E36", "E37")  # what verl's micro-batching can raise


def failure_from(exc: BaseException) -> StageFailure:
    """Wrap an AssertionError/ValueError raised by a labkit mirror of verl into a StageFailure with its E-code
    (E32: verl's bare assert, with no text)."""
    msg = str(exc)
    code = code_of(msg, _CODES) if msg else "E32"
    if code is None:
        raise AssertionError(f"labkit raised a micro-batching error the catalogue does not know: {msg!r}") from exc
    return StageFailure(code, type(exc).__name__, msg)


def static_partitions(rows: int, m: int, profile: str) -> list[list[int]]:
    """Static micro-batches as local index lists: legacy ``DataProto.split(m)`` (ragged last), engine chunk (E30)."""
    try:
        return _static(rows, m, profile)
    except AssertionError as exc:
        raise failure_from(exc) from None


@lru_cache(maxsize=256)
def _static(rows: int, m: int, profile: str) -> list[list[int]]:
    return static_micro_batches(rows, m, profile=profile)


def check_vpp_groups(count: int, group: int) -> None:
    """The Megatron engine's assert on a static cut: the micro-batch count must divide by G = the virtual pipeline's
    ``num_batches_divided_by`` (``verl/workers/engine/utils.py: prepare_micro_batches``; static counts are not
    rounded up)."""
    if count % group:
        raise StageFailure("M21", "AssertionError", vpp_message(count, group))


def vpp_message(count: int, group: int) -> str:
    """verl's VPP assert text; its placeholder prints the list of micro-batch TensorDicts, shown here by count."""
    return message("M21", micro_batches=f"[{count} micro-batches]", group=group)


def dynamic_partitions(
    ctx: Ctx, per_rank: Sequence[Sequence[int]], budget: int, group: int | None = None
) -> tuple[list[tuple[list[list[int]], list[int], list[int]]], dict[str, int]]:
    """Dynamic micro-batches of every DP rank at once (count synced by MAX): per rank (local index lists, tokens,
    workloads), and the sync collectives each rank issues (names from ``labkit.rules.collectives.COLLECTIVES``);
    ``group``: Megatron's G, the count rounded up to a multiple of it.
    """
    return dynamic_partitions_each(ctx, [per_rank], budget, group)[0]


def dynamic_partitions_each(
    ctx: Ctx, batches: Sequence[Sequence[Sequence[int]]], budget: int, group: int | None = None
) -> list[tuple[list[tuple[list[list[int]], list[int], list[int]]], dict[str, int]]]:
    """``dynamic_partitions`` of several batches the DP ranks cut one after another (an update's mini-batches),
    planned together (``labkit.balance.micro_batches.plan_dp_micro_batches_each``); a failure is the first batch's, as in verl."""
    # the algorithm: the engine's hard cap (0.9.1), or the budget that only sets the count (legacy, engine 0.8/0.9.0)
    algo = "engine" if ctx.profile == "engine" and ctx.geo.budget_cap else "legacy"
    keys = [("dyn", algo, budget, group, tuple(tuple(r) for r in per_rank)) for per_rank in batches]
    todo = [j for j, key in enumerate(keys) if key not in ctx.cache]
    if todo:
        lens = [[[ctx.lengths[i] for i in idx] for idx in batches[j]] for j in todo]
        width = ctx.geo.width if ctx.profile == "legacy" else None  # the engine's floor is the longest real row
        try:
            plans = plan_dp_micro_batches_each(
                lens, budget, profile=algo, max_seq_len=width, num_batches_divided_by=group
            )
        except (AssertionError, ValueError) as exc:  # the failing batch (the first, as in verl) names E31's row
            raise _failure(exc, lens[getattr(exc, "batch_index", 0)], ctx.profile) from None
        for j, batch_plans in zip(todo, plans):
            # verl always syncs here (legacy: world group; engine: the DP group), even when D = 1
            coll = {"all_reduce(max):num_micro_batches": 1}
            if algo == "engine":
                coll["all_reduce(max):group_stats"] = 1
                coll["all_reduce(min):within_limit"] = batch_plans[0].attempts
            ctx.cache[keys[j]] = ([(p.indices, p.tokens, p.workloads) for p in batch_plans], coll)
    return [ctx.cache[key] for key in keys]


def megatron_padded(ctx: Ctx, ids: Sequence[int], rmpad: bool) -> tuple[int, int]:
    """A Megatron micro-batch's padded tokens and the share one GPU holds (CP): packed rows each padded to the
    sequence alignment (``verl/models/mcore/util.py: preprocess_thd_engine``); unpacked (BSHD) rows padded to the
    longest row, rounded to the alignment (``preprocess_bshd_engine``; verl pads to the mini-batch's longest with
    ``pad_bshd_to_minibatch_max``, which the micro-batch's longest stands in for)."""
    layout = ctx.geo.parallel
    align = sequence_alignment(layout)
    if rmpad:
        rows = ctx.cache.get("megatron_padded_rows")
        if rows is None:  # each row's padded length, once per plan
            rows = ctx.cache["megatron_padded_rows"] = [padded_row(x, align) for x in ctx.lengths]
        return sum(map(rows.__getitem__, ids)), layout.cp
    longest = max(map(ctx.lengths.__getitem__, ids), default=0)
    return len(ids) * padded_row(longest, align), layout.cp


def _failure(exc: BaseException, lens: list[list[int]], profile: str) -> StageFailure:
    fail = failure_from(exc)
    if fail.code == "E31" and profile == "engine":
        # every DP rank whose longest row exceeds the budget raises; show the rank holding the longest row.
        # verl takes max() over a 1-D tensor, so the value prints as a 0-d tensor
        longest = max(max(x) for x in lens)
        fail.message = re.sub(r"max_seq_len=\S+$", f"max_seq_len=tensor({longest})", fail.message)
    return fail


def micro_records(
    ctx: Ctx, idx: Sequence[int], parts: Any, sp: int, rmpad: bool
) -> tuple[list[MicroBatchRecord], list[int] | None]:
    """MicroBatchRecords for the rank's rows ``idx`` cut into ``parts`` (local positions, or the dynamic triple
    (positions, tokens, workloads)), plus the tokens each SP rank holds per micro-batch.

    padded_tokens: rmpad off → legacy rows × (prompt_length + response_length) (the rollout's padded width), engine
    rows × the micro-batch's longest row (``torch.nested.to_padded_tensor``); rmpad on → real tokens + Ulysses pad to
    a multiple of sp (``ulysses_pad``). Each SP rank holds padded_tokens / sp of every packed micro-batch. Megatron
    (``megatron_padded``): each row padded to TP·CP·2 or TP, and each CP rank holds padded_tokens / CP.
    """
    key = ("rec", id(parts), tuple(idx[:1]), len(idx), sp, rmpad)
    hit = ctx.cache.get(key)
    if hit is not None and hit[0] is parts:
        return hit[1]
    orig = parts
    if isinstance(parts, tuple):
        parts, toks, wls = parts
    else:
        toks = wls = None
    recs, per_sp = [], []
    lens, width = ctx.lengths, ctx.geo.width
    megatron, share = ctx.geo.parallel.is_megatron, ctx.geo.parallel.cp if ctx.geo.parallel.is_megatron else sp
    for k, part in enumerate(parts):
        ids = [idx[j] for j in part]
        if lens is None:
            tok = wl = None
        elif toks is not None:
            tok, wl = toks[k], float(wls[k])
        else:
            tok = sum(map(lens.__getitem__, ids))
            wl = float(sum(map(ctx.workloads.__getitem__, ids)))
        if megatron and lens is not None:
            padded, share = megatron_padded(ctx, ids, rmpad)
        elif not rmpad:
            if ctx.profile == "legacy":
                padded = len(ids) * width
            else:
                padded = None if lens is None or not ids else len(ids) * max(map(lens.__getitem__, ids))
        else:
            padded = None if tok is None else ulysses_padded(tok, sp)
        recs.append(MicroBatchRecord(len(ids), tok, padded, wl, ids))
        per_sp.append(None if padded is None else padded // share)
    out = recs, (None if None in per_sp else per_sp)
    ctx.cache[key] = (orig, out)  # holding orig keeps id(orig) from being reused
    return out
