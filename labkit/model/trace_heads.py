"""Mirrors of verl's log-prob heads for the fake-CUDA memory trace (``labkit.model.memory_trace``): the entropy in
each of its forms, the torch fallback log-prob, the fused log-prob kernel, and stand-ins for what fake tensors cannot
run (flash_attn's Triton cross-entropy, inductor's compiled entropy). Each allocates what verl's own allocates."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.checkpoint


def entropy_eager(logits: torch.Tensor) -> torch.Tensor:
    """verl's ``entropy_from_logits``: softmax, logsumexp, minus the expected logit (under autocast: fp32)."""
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def entropy_chunked(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    """verl's ``entropy_from_logits_with_chunking``: an fp32 copy, softmax and product of ``chunk`` rows at a time,
    written into a (T,) fp32 result."""
    out = torch.zeros(logits.shape[0], device=logits.device)
    for start in range(0, logits.shape[0], chunk):
        z = logits[start : start + chunk].float()
        pd = torch.nn.functional.softmax(z, dim=-1)
        out[start : start + chunk] = torch.logsumexp(z, dim=-1) - torch.sum(pd * z, dim=-1)
    return out


class TorchRowsLogProb(torch.autograd.Function):
    """Stand-in for verl's torch fallback head for bf16 logits (``logprobs_from_logits_v2``, no flash_attn): a
    log-softmax per token row, the taken token gathered, the rows stacked. It allocates what the loop does in all:
    under grad every row's fp32 log-softmax is saved (T × V × 4 bytes) and the backward stacks the rows' bf16
    gradients (T × V); under no_grad one row at a time. (The loop itself on fake tensors costs a Python dispatch per
    token: minutes at 16k tokens; traced as a loop at 2k tokens it held the same bytes.)"""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, keep: bool) -> torch.Tensor:
        vocab = logits.shape[-1]
        tokens = logits.numel() // vocab
        ctx.grad_dtype, ctx.shape = logits.dtype, logits.shape
        if keep:
            ctx.save_for_backward(logits.new_empty((tokens, vocab), dtype=torch.float32))
        else:  # one row's fp32 upcast and log-softmax at a time
            logits.new_empty((2, vocab), dtype=torch.float32)
        return logits.new_empty(tokens, dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (saved,) = ctx.saved_tensors
        return saved.new_empty(ctx.shape, dtype=ctx.grad_dtype), None


def logprobs_rows(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """verl's torch fallback head (``TorchRowsLogProb``)."""
    del labels
    return TorchRowsLogProb.apply(logits, logits.requires_grad)


def fused_chunk_forward(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float):
    """One chunk of verl's fused log-prob (``FusedLinearForPPO``, torch backend): the chunk's logits from the hidden
    states, fp32 softmax, entropy and log-softmax, nothing of the other chunks."""
    z = ((hidden @ weight.t()) / temperature).float()
    pd = z.softmax(dim=-1)
    ent = torch.logsumexp(z, dim=-1) - torch.sum(pd * z, dim=-1)
    logp = z.log_softmax(dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return logp, ent.to(hidden.dtype)


class FusedLinearPPO(torch.autograd.Function):
    """verl's ``use_fused_kernels`` head: log-probs and entropy from the last hidden states ``chunk`` tokens at a
    time; backward recomputes each chunk's logits and accumulates the hidden-state and LM-head gradients."""

    @staticmethod
    def forward(ctx: Any, hidden: Any, weight: Any, labels: Any, temperature: float, chunk: int) -> Any:
        ctx.set_materialize_grads(False)  # an unused entropy brings no gradient (verl's kernel does the same)
        tokens = hidden.shape[0]
        logp = hidden.new_zeros(tokens, dtype=torch.float32)
        ent = hidden.new_zeros(tokens)
        for start in range(0, tokens, chunk):
            end = min(start + chunk, tokens)
            logp[start:end], ent[start:end] = fused_chunk_forward(
                hidden[start:end], weight, labels[start:end], temperature
            )
        ctx.save_for_backward(hidden, weight, labels)
        ctx.temperature, ctx.chunk = temperature, chunk
        return logp, ent

    @staticmethod
    def backward(ctx: Any, dlogp: Any, dent: Any) -> Any:
        hidden, weight, labels = ctx.saved_tensors
        t, dh, dw = ctx.temperature, torch.zeros_like(hidden), torch.zeros_like(weight)
        for start in range(0, hidden.shape[0], ctx.chunk):
            end = min(start + ctx.chunk, hidden.shape[0])
            z = (hidden[start:end] @ weight.t()) / t
            zf = z.float()
            pd = zf.softmax(dim=-1)
            onehot = torch.zeros_like(zf).scatter_(-1, labels[start:end].unsqueeze(-1), 1)
            grad = dlogp[start:end].float().unsqueeze(-1) * (onehot - pd)
            if dent is not None:
                ent = torch.logsumexp(zf, dim=-1) - torch.sum(pd * zf, dim=-1)
                grad = grad + pd * (zf.log_softmax(dim=-1) + ent.unsqueeze(-1)) * (-dent[start:end].unsqueeze(-1))
            grad = grad.to(z.dtype) / t
            dh[start:end] += grad @ weight
            dw += grad.t() @ hidden[start:end]
        return dh, dw, None, None, None


class CompiledEntropy(torch.autograd.Function):
    """Stand-in for inductor's fused entropy: three (T, 1) fp32 statistics and the (T,) result, nothing T × V."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor) -> torch.Tensor:
        stats = [logits.new_empty((logits.shape[0], 1), dtype=torch.float32) for _ in range(3)]
        ctx.save_for_backward(logits, *stats)
        return logits.new_empty(logits.shape[0], dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(ctx.saved_tensors[0])


class FlashCrossEntropy(torch.autograd.Function):
    """Stand-in for flash_attn's Triton cross-entropy (verl's ``logprobs_from_logits`` on GPUs): O(T) outputs; the
    backward writes the logits' gradient into the logits with ``inplace_backward=True`` (verl passes False when it
    also computes the entropy on the packed path), into a new tensor otherwise."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, inplace: bool) -> torch.Tensor:
        lse = logits.new_empty(logits.shape[0], dtype=torch.float32)
        ctx.save_for_backward(logits, lse)
        ctx.inplace = inplace
        return logits.new_empty(logits.shape[0], dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits = ctx.saved_tensors[0]
        return (logits if ctx.inplace else torch.empty_like(logits)), None, None


def entropy_of(mode: str, logits: torch.Tensor, chunk: int) -> torch.Tensor | None:
    """The entropy as verl computes it in ``mode``: none | eager | compiled | chunked | checkpointed."""
    if mode == "none":
        return None
    if mode == "eager":
        return entropy_eager(logits)
    if mode == "compiled":
        return CompiledEntropy.apply(logits)
    if mode == "chunked":
        return entropy_chunked(logits, chunk)
    return torch.utils.checkpoint.checkpoint(entropy_eager, logits, use_reentrant=False)
