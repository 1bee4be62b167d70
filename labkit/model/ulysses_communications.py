"""Ulysses' collectives as autograd functions over a torch.distributed SP group: the all-to-all that trades a sequence
split for a head split (and back in backward), and the all-gather of per-rank outputs. Mirrors verl/utils/ulysses.py
(SeqAllToAll, Gather); the math around them is ``labkit.model.ulysses``. Calls go through
``labkit.runtime.dist.guarded`` (timeouts, counted for the trace).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from labkit.runtime import dist as ldist


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: ProcessGroup) -> torch.Tensor:
    """Split ``scatter_dim`` into sp parts, send part j to rank j, concatenate what arrives along ``gather_dim``."""
    sp = dist.get_world_size(group)
    inputs = [t.contiguous() for t in torch.tensor_split(x, sp, scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(sp)]
    with ldist.guarded("all_to_all", group) as timeout:
        ldist._wait(dist.all_to_all(outputs, inputs, group=group, async_op=True), timeout)
    return torch.cat(outputs, dim=gather_dim).contiguous()


class SeqAllToAll(torch.autograd.Function):
    """All-to-all over the SP group; backward is the reverse all-to-all. Mirrors verl.utils.ulysses.SeqAllToAll."""

    @staticmethod
    def forward(ctx: Any, group: ProcessGroup, x: torch.Tensor, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None, None]:
        return None, _all_to_all(grad, ctx.gather_dim, ctx.scatter_dim, ctx.group), None, None


class Gather(torch.autograd.Function):
    """All-gather along ``gather_dim``; backward keeps this rank's part of the gradient, ×sp when ``grad_scaler``
    (every SP rank computes the same loss from the gathered tensor, and FSDP then averages gradients over the SP
    ranks: ×sp undoes that average). Mirrors verl.utils.ulysses.Gather."""

    @staticmethod
    def forward(ctx: Any, group: ProcessGroup, x: torch.Tensor, gather_dim: int, grad_scaler: bool) -> torch.Tensor:
        ctx.sp, ctx.rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.gather_dim, ctx.grad_scaler, ctx.part = gather_dim, grad_scaler, x.size(gather_dim)
        return torch.cat(ldist.all_gather(x.contiguous(), group), dim=gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None, None]:
        if ctx.grad_scaler:
            grad = grad * ctx.sp
        return None, grad.narrow(ctx.gather_dim, ctx.rank * ctx.part, ctx.part).contiguous(), None, None
