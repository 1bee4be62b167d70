"""Log-probs and entropy from logits (or from hidden states and the LM head, chunked), the math of a rank's
log-prob pass. Mirrors verl/utils/torch_functional.py and verl/utils/experimental/torch_functional.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: logsumexp − Σ p·z. Mirrors verl_F.entropy_from_logits."""
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) by log_softmax + gather, in the logits' dtype: the plain PyTorch path.
    Mirrors verl/utils/torch_functional.py: logprobs_from_logits_naive."""
    return torch.gather(F.log_softmax(logits, dim=-1), -1, labels.unsqueeze(-1)).squeeze(-1)


def _chunk_logits(x: torch.Tensor, weight: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """fp32 logits of one chunk of rows: x are logits, or hidden states when the LM-head ``weight`` is given."""
    z = x if weight is None else x @ weight.T
    if temperature != 1.0:  # verl divides by the temperature in the model dtype, then upcasts; T = 1 skips a copy
        z = z / temperature
    return z.float()


def _chunk_logprob(x: torch.Tensor, weight: torch.Tensor | None, labels: torch.Tensor, temp: float) -> torch.Tensor:
    """log p(label) of one chunk; its chunk × V temporaries die with this frame."""
    return F.log_softmax(_chunk_logits(x, weight, temp), dim=-1).gather(-1, labels[:, None]).squeeze(-1)


def _chunk_grad_z(x: torch.Tensor, weight: torch.Tensor | None, labels: torch.Tensor, g: torch.Tensor, temp: float):
    """d(Σ g·log p_y)/dz of one chunk, z = x or x @ weightᵀ: (onehot(y) − softmax) · g / T, in x's dtype."""
    grad = -(torch.exp(F.log_softmax(_chunk_logits(x, weight, temp), dim=-1)) * g[:, None])
    grad.scatter_add_(-1, labels[:, None], g[:, None])
    return grad.to(x.dtype) / temp


class _ChunkedLogProb(torch.autograd.Function):
    """log p(label) row-chunk by row-chunk; backward recomputes each chunk's softmax instead of saving it."""

    @staticmethod
    def forward(ctx, x, weight, labels, chunk_size, temperature):  # type: ignore[override]
        out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        for s in range(0, x.shape[0], chunk_size):
            rows = slice(s, s + chunk_size)
            out[rows] = _chunk_logprob(x[rows], weight, labels[rows], temperature)
        ctx.save_for_backward(x, weight, labels)
        ctx.chunk_size, ctx.temperature = chunk_size, temperature
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        x, weight, labels = ctx.saved_tensors
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if ctx.needs_input_grad[1] else None
        for s in range(0, x.shape[0], ctx.chunk_size):
            rows = slice(s, s + ctx.chunk_size)
            grad_z = _chunk_grad_z(x[rows], weight, labels[rows], grad_out[rows], ctx.temperature)
            if weight is None:
                grad_x[rows] = grad_z
                continue
            if grad_x is not None:
                grad_x[rows] = grad_z @ weight
            if grad_w is not None:
                grad_w += (grad_z.T @ x[rows]).float()
            del grad_z
        return grad_x, None if grad_w is None else grad_w.to(weight.dtype), None, None, None


def logprobs_from_logits_chunked(
    logits_or_hidden: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int = 1024,
    *,
    lm_head_weight: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """fp32 log p(label) computed ``chunk_size`` tokens at a time: the only fp32 temporaries are chunk × V, in
    forward and backward. With ``lm_head_weight`` the input is hidden states and full logits never exist.
    Same numbers as log_softmax((z / T).float()).gather. Mirrors verl/utils/experimental/torch_functional.py:
    FusedLinearForPPO (hidden) and entropy_from_logits_with_chunking's row chunks (logits)."""
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if logits_or_hidden.shape[:-1] != labels.shape:
        raise ValueError(f"labels shape {tuple(labels.shape)} != leading dims {tuple(logits_or_hidden.shape[:-1])}")
    flat = logits_or_hidden.reshape(-1, logits_or_hidden.shape[-1])
    out = _ChunkedLogProb.apply(flat, lm_head_weight, labels.reshape(-1), chunk_size, temperature)
    return out.view(labels.shape)
