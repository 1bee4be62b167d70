"""Tensor-parallel collectives as autograd-aware functions over a torch.distributed TP group.

The communication half of labkit's rollout TP (picotron's ``tp_communications`` split: the sharding math lives in
``labkit.model.tp_parallel``). The two region functions are Megatron-LM's ``f``/``g`` operators (Shoeybi et al. 2019, §3):
``copy_to_tp_region`` is identity forward / all-reduce backward, ``reduce_from_tp_region`` is all-reduce forward /
identity backward. verl has no such code of its own: it delegates rollout TP to vLLM, which uses the same pair.
Every call goes through ``labkit.runtime.dist`` (a timeout, the hang report, the per-rank log), counted under the
planner's names: "all_reduce(tp)", "broadcast(tp):logits", "all_gather(tp):fingerprint"
(``labkit.rules.collectives.tp_generate_collectives`` predicts them).
"""

from __future__ import annotations

import datetime
from collections import Counter

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from labkit.runtime import dist as ldist

__all__ = [
    "tp_rank",
    "tp_size",
    "copy_to_tp_region",
    "reduce_from_tp_region",
    "broadcast_from_tp_rank0",
    "tp_fingerprints_agree",
    "tp_collective_counts",
]

_COUNTS: Counter = Counter()


def tp_collective_counts() -> dict[str, int]:
    """Collectives this process has issued through this module, by kind (TP size 1 issues none): for the trace."""
    return dict(_COUNTS)


def tp_size(group: ProcessGroup | None) -> int:
    """Ranks in the TP group (1 without torch.distributed); a local query, never a collective."""
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def tp_rank(group: ProcessGroup | None) -> int:
    """This process's rank inside the TP group (0 without torch.distributed); a local query, never a collective."""
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def _all_reduce_sum(x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    if tp_size(group) == 1:
        return x
    out = x.contiguous().clone()  # all_reduce works in place; never clobber a tensor autograd saved
    ldist.all_reduce(out, "sum", group=group, name="all_reduce(tp)")
    _COUNTS["all_reduce"] += 1
    return out


class _CopyToTPRegion(torch.autograd.Function):
    """Megatron's ``f``: the input of a column-parallel linear. Forward: identity; backward: all-reduce the gradient.

    Each rank's local columns see the whole input, so the input's gradient is the sum of every rank's contribution.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_reduce_sum(grad, ctx.group), None


class _ReduceFromTPRegion(torch.autograd.Function):
    """Megatron's ``g``: the output of a row-parallel linear. Forward: all-reduce the partial sums; backward: identity."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
        return _all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def copy_to_tp_region(x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """Enter a TP region (identity forward, gradient all-reduced over ``group`` in backward)."""
    return _CopyToTPRegion.apply(x, group)


def reduce_from_tp_region(x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """Leave a TP region: sum the ranks' partial outputs over ``group`` (all-reduce forward, identity backward)."""
    return _ReduceFromTPRegion.apply(x, group)


def broadcast_from_tp_rank0(x: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """Overwrite ``x`` in place with TP rank 0's copy (no autograd); used to make sampling inputs bitwise identical."""
    if tp_size(group) == 1:
        return x
    src = dist.get_global_rank(group, 0) if group is not None else 0
    with ldist.guarded("broadcast(tp):logits", group) as timeout:
        dist.broadcast(x, src=src, group=group, async_op=True).wait(datetime.timedelta(seconds=timeout))
    _COUNTS["broadcast"] += 1
    return x


def _fingerprint(ids: torch.Tensor) -> torch.Tensor:
    """A fixed-size int64 summary of a 2-D id tensor: shape, sum and two position-weighted sums."""
    ids = ids.detach().to("cpu", torch.int64)
    flat = ids.reshape(-1)
    w = torch.arange(1, flat.numel() + 1, dtype=torch.int64)
    return torch.stack(
        [
            torch.tensor(ids.shape[0]),
            torch.tensor(ids.shape[-1]),
            flat.sum(),
            (flat * w).sum(),
            (flat * (w % 9973 + 1) * (w % 7 + 1)).sum(),
        ]
    )


def tp_fingerprints_agree(ids: torch.Tensor, group: ProcessGroup | None) -> bool:
    """True when every TP rank holds the same ids (one small all_gather; every rank gets the same answer)."""
    n = tp_size(group)
    if n == 1:
        return True
    mine = _fingerprint(ids)
    gathered = ldist.all_gather(mine, group, _name="all_gather(tp):fingerprint")
    _COUNTS["all_gather"] += 1
    return all(torch.equal(g, gathered[0]) for g in gathered)
