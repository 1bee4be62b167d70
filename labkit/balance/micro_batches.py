"""Micro-batching on one DP rank: dynamic (token budget, KK buckets, DP-synced count) and static (fixed rows).

Mirrors verl/utils/seqlen_balancing.py: rearrange_micro_batches, get_reverse_idx, restore_dynamic_batch and
verl/workers/engine/utils.py: prepare_micro_batches, under two profiles:
``legacy`` (verl <= 0.7, and the engine of 0.8.0 and 0.9.0: the budget is a target, buckets may exceed it) and ``engine`` (0.9.1: a hard cap, E34/E35).
The planner works on sequence lengths; DP all-reduces go through a pluggable `dp_sync`, so one code path serves a
live rank (a real all_reduce) and the planner (every rank simulated in lockstep by `plan_dp_micro_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from labkit.balance.kk import as_values
from labkit.balance.lockstep import free_partitions, lockstep
from labkit.balance.micro_batch_plan import DpSync, MicroBatchPlan, SyncSteps
from labkit.rules.catalogue import message
from labkit.rules.geometry import ceil_div, workload

PROFILES = ("legacy", "engine")


def roundup_divisible(a: int, b: int) -> int:
    """Smallest multiple of b that is >= a. Mirrors seqlen_balancing.roundup_divisible."""
    return ((a + b - 1) // b) * b


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")


def rank_plan_steps(
    seqlens: Any,
    max_token_len: int,
    profile: str,
    max_seq_len: Any,
    sync: bool,
    num_batches_divided_by: int | None,
    min_num_micro_batch: int | None,
    use_dynamic_bsz_balance: bool,
    force_group_size: int,
) -> SyncSteps:
    """One rank's rearrange_micro_batches as a generator that yields each DP all-reduce it needs."""
    _check_profile(profile)
    lens = as_values(seqlens)
    if set(map(type, lens)) != {int}:
        lens = [int(x) for x in lens]
    if max_seq_len is None:  # verl's nested path: max over the lengths (a 0-d tensor for a tensor input)
        max_seq_len = max(seqlens) if hasattr(seqlens, "is_floating_point") else max(lens)
    assert max_token_len >= max_seq_len, message("E31", budget=max_token_len, longest=repr(max_seq_len))
    g = force_group_size
    assert len(lens) % g == 0, f"Batch size {len(lens)} must be divisible by force_group_size {g}"
    num_groups = len(lens) // g
    k = min(num_groups, ceil_div(sum(lens), max_token_len))
    if min_num_micro_batch is not None:  # pipeline parallel
        k = max(min_num_micro_batch, k)
    syncs: list[str] = []
    if sync:
        (k,) = yield "max", [k]
        syncs.append("max")
    if num_batches_divided_by is not None:  # Megatron virtual PP
        k = roundup_divisible(k, num_batches_divided_by)
    if profile == "legacy":
        assert k <= num_groups  # E32: a bare assert in verl
    sample_w = [workload(x) for x in lens]
    group_w = [sum(sample_w[j * g : (j + 1) * g]) for j in range(num_groups)] if g > 1 else sample_w
    group_len = [sum(lens[j * g : (j + 1) * g]) for j in range(num_groups)] if g > 1 else lens
    attempts = 1
    if profile == "legacy":  # the budget only sets the count; a bucket may exceed it
        parts = yield "kk", (group_w, k)
        tokens = [sum(map(group_len.__getitem__, part)) for part in parts]
    else:
        max_group, min_groups = max(group_len), num_groups
        if sync:  # agree on fatal constraints before any rank raises, else peers hang
            max_group, neg_groups = yield "max", [max_group, -num_groups]
            min_groups = -neg_groups
            syncs.append("max")
        if max_group > max_token_len:
            raise ValueError(
                "A forced group exceeds max_token_len and cannot be split. "
                f"Got max_group_token_len={max_group} and max_token_len={max_token_len}."
            )
        attempts = 0
        while True:
            if k > min_groups:
                raise ValueError(
                    "Cannot satisfy max_token_len while keeping forced groups atomic and using the same "
                    "micro-batch count across DP ranks. "
                    f"Requested {k} non-empty micro-batches, but a rank has only {min_groups} forced groups."
                )
            parts = yield "kk", (group_w, k)
            attempts += 1
            tokens = [sum(map(group_len.__getitem__, part)) for part in parts]
            fits = max(tokens) <= max_token_len
            if sync:
                (fits,) = yield "min", [int(fits)]
                syncs.append("min")
            if fits:
                break
            k += num_batches_divided_by or 1
    keyed = [(sum(map(group_w.__getitem__, part)), part[0] * g, part, tok) for part, tok in zip(parts, tokens)]
    if use_dynamic_bsz_balance:  # heaviest in the middle, light buckets at both ends (pipeline bubbles)
        keyed.sort(key=lambda t: t[:2], reverse=True)
        keyed = keyed[::2][::-1] + keyed[1::2]
    if g == 1:
        indices = [part for _, _, part, _ in keyed]
    else:
        indices = [[i for j in part for i in range(j * g, (j + 1) * g)] for _, _, part, _ in keyed]
    return MicroBatchPlan(
        indices=indices,
        tokens=[tok for _, _, _, tok in keyed],
        workloads=[w for w, _, _, _ in keyed],
        profile=profile,
        attempts=attempts,
        syncs=syncs,
    )


def rearrange_micro_batches(
    seqlens: Any,
    max_token_len: int,
    *,
    profile: str = "engine",
    max_seq_len: Any = None,
    dp_sync: DpSync | None = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
) -> MicroBatchPlan:
    """Dynamic micro-batches of one rank from its effective lengths. Mirrors seqlen_balancing.rearrange_micro_batches.

    `max_seq_len`: the padded width on verl's padded path (E31 compares the budget to it); None = longest row.
    `dp_sync` None = no DP sync (verl: no dp_group); otherwise called for each all-reduce, in verl's order.
    """
    steps = rank_plan_steps(
        seqlens,
        max_token_len,
        profile,
        max_seq_len,
        dp_sync is not None and same_micro_num_in_dp,
        num_batches_divided_by,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
        force_group_size,
    )
    reply = None
    try:
        while True:
            op, values = steps.send(reply)
            reply = free_partitions(*values) if op == "kk" else list(dp_sync(op, values))
    except StopIteration as done:
        return done.value


def plan_dp_micro_batches(
    per_rank_seqlens: Sequence[Any],
    max_token_len: int,
    *,
    profile: str = "engine",
    max_seq_len: Any = None,
    dp_group: bool = True,
    same_micro_num_in_dp: bool = True,
    num_batches_divided_by: int | None = None,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
) -> list[MicroBatchPlan]:
    """Every DP rank's micro-batches with the all-reduces simulated in lockstep (what verl computes on D ranks).

    `dp_group`: whether verl is given a DP group (engine workers: yes; 0.7.1 dp_actor passes none, so no sync).
    `max_seq_len`: one width for all ranks, a list (one per rank), or None. An error is raised as verl raises it,
    with a note naming the dp_rank (in verl, ranks that did not raise would then wait in the next all_reduce).
    """
    return plan_dp_micro_batches_each(
        [per_rank_seqlens],
        max_token_len,
        profile=profile,
        max_seq_len=max_seq_len,
        dp_group=dp_group,
        same_micro_num_in_dp=same_micro_num_in_dp,
        num_batches_divided_by=num_batches_divided_by,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=use_dynamic_bsz_balance,
        force_group_size=force_group_size,
    )[0]


def plan_dp_micro_batches_each(
    groups: Sequence[Sequence[Any]], max_token_len: int, **kwargs: Any
) -> list[list[MicroBatchPlan]]:
    """`plan_dp_micro_batches` for several batches that the same DP ranks cut one after another (the mini-batches of
    an update): each batch's all-reduces stay within it, and the KK partitions of all of them are computed together.
    The first error is the one verl meets first: the lowest dp_rank of the first failing batch (its index in
    ``groups`` is the exception's ``batch_index``)."""
    profile, width = kwargs.get("profile", "engine"), kwargs.get("max_seq_len")
    sync = kwargs.get("dp_group", True) and kwargs.get("same_micro_num_in_dp", True)
    rest = (
        kwargs.get("num_batches_divided_by"),
        kwargs.get("min_num_micro_batch"),
        kwargs.get("use_dynamic_bsz_balance", True),
        kwargs.get("force_group_size", 1),
    )
    gens = {}
    for g, per_rank in enumerate(groups):
        widths = width if isinstance(width, (list, tuple)) else [width] * len(per_rank)
        for r, (lens, w) in enumerate(zip(per_rank, widths)):
            gens[g, r] = rank_plan_steps(lens, max_token_len, profile, w, sync, *rest)
    try:
        plans = lockstep(gens)
    except Exception:
        if len(groups) == 1:
            raise
        for g, per_rank in enumerate(groups):  # one batch at a time, as verl runs them: the error verl meets first
            try:
                plan_dp_micro_batches_each([per_rank], max_token_len, **kwargs)
            except Exception as first:
                first.batch_index = g  # type: ignore[attr-defined]  # which batch failed, for the caller's message
                raise
        raise
    return [[plans[g, r] for r in range(len(per_rank))] for g, per_rank in enumerate(groups)]


def static_micro_batches(
    num_rows: int, micro_batch_size_per_gpu: int, *, profile: str = "engine", force_group_size: int = 1
) -> list[list[int]]:
    """Fixed-size micro-batches: legacy `DataProto.split(m)` (ragged last), engine `chunk_tensordict` with E30."""
    _check_profile(profile)
    m = micro_batch_size_per_gpu
    if profile == "legacy":
        return [list(range(i, min(i + m, num_rows))) for i in range(0, num_rows, m)]
    assert num_rows % (force_group_size * m) == 0, message("E30")
    chunks = num_rows // (m * force_group_size)
    assert num_rows % chunks == 0, message("E27", size=num_rows, chunks=chunks)
    size = num_rows // chunks
    return [list(range(i, i + size)) for i in range(0, num_rows, size)]


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """Inverse permutation: output[idx_map[i]] = i. Mirrors seqlen_balancing.get_reverse_idx."""
    reverse = list(idx_map)
    for i, j in enumerate(idx_map):
        reverse[j] = i
    return reverse


def restore_dynamic_batch(data: Any, batch_idx_list: list[list[int]]) -> Any:
    """Put per-row outputs of concatenated micro-batches back in input order (E39). Mirrors restore_dynamic_batch."""
    indices = list(chain.from_iterable(batch_idx_list))
    batch_size = data.shape[0] if hasattr(data, "shape") else len(data)
    assert len(indices) == batch_size, f"{len(indices)} vs. {batch_size}"
    revert = get_reverse_idx(indices)
    if isinstance(data, (list, tuple)):
        return [data[i] for i in revert]
    if getattr(data, "is_nested", False):
        import torch

        rows = data.unbind()
        return torch.nested.as_nested_tensor([rows[i] for i in revert], layout=torch.jagged)
    import numpy as np

    return data[np.asarray(revert, dtype=np.int64)] if isinstance(data, np.ndarray) else data[_long(revert)]


def _long(idx: list[int]) -> Any:
    import torch

    return torch.tensor(idx, dtype=torch.long)


def rearrange_tensordict(batch: Any, max_token_len: int, **kwargs: Any) -> tuple[list[Any], MicroBatchPlan]:
    """rearrange_micro_batches on a TensorDict (nested `input_ids` or padded `attention_mask`): micro-batches, plan."""
    import torch

    input_ids = batch["input_ids"]
    if input_ids.is_nested:
        seqlens, width = input_ids.offsets().diff(), None
    else:
        seqlens, width = batch["attention_mask"].sum(dim=1), batch["attention_mask"].shape[-1]
    plan = rearrange_micro_batches(seqlens, max_token_len, max_seq_len=width, **kwargs)
    nested = [key for key, val in batch.items() if isinstance(val, torch.Tensor) and val.is_nested]
    micro_batches = []
    for idx in plan.indices:
        mb = batch.exclude(*nested)[_long(idx)]
        for key in nested:
            rows = batch[key].unbind()
            mb.set(key, torch.nested.as_nested_tensor([rows[i] for i in idx], layout=torch.jagged))
        micro_batches.append(mb)
    return micro_batches, plan
