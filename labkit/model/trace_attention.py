"""Attention for the fake-CUDA memory trace (``labkit.model.memory_trace``): HF's attention call routed to PyTorch's
copy of flash-attention's varlen kernel on the packed row, as verl runs it with ``use_remove_padding``, and, under
Ulysses sequence parallelism, verl's all-to-alls around it (each rank holds 1/SP of the tokens; attention sees every
token of 1/SP of the heads)."""

from __future__ import annotations

from typing import Any

import torch

CU: dict[str, Any] = {}
"""The micro-batch of the pass being traced: ``cu`` (cumulative sequence lengths over all SP ranks' tokens), ``max``
(the longest sequence), ``sp`` (the Ulysses group size); on the padded path ``indices``, the real tokens' positions in
the flattened (rows × width) batch."""


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, sp: int) -> torch.Tensor:
    """What one rank allocates in verl's ``all_to_all_tensor``: a contiguous copy of each of its SP slices, the slices
    it receives, and their concatenation."""
    sent = [part.contiguous() for part in torch.tensor_split(x, sp, scatter_dim)]
    received = [torch.empty_like(sent[0]) for _ in range(sp)]  # the peers' slices
    del sent
    return torch.cat(received, dim=gather_dim).contiguous()


class SeqAllToAll(torch.autograd.Function):
    """verl's ``SeqAllToAll``: the backward is the opposite all-to-all."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, sp: int) -> torch.Tensor:
        ctx.dims = (scatter_dim, gather_dim, sp)
        return _all_to_all(x, scatter_dim, gather_dim, sp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim, sp = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, sp), None, None, None


def _repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """(1, T, kv, d) -> (1, T, kv·times, d): verl repeats the K/V heads when there are fewer than SP ranks."""
    if times == 1:
        return x
    b, t, kv, d = x.shape
    return x[:, :, :, None, :].expand(b, t, kv, times, d).reshape(b, t, kv * times, d)


def varlen_attention(
    module: Any, q: Any, k: Any, v: Any, mask: Any, scaling: Any = None, dropout: float = 0.0, **kw: Any
) -> Any:
    """HF attention ((1, h, T, d) in, (1, T, h, d) out) through FA2's varlen kernel; with Ulysses SP, verl's
    ``_ulysses_flash_attention_forward``: repeat K/V heads up to SP, gather the sequence and scatter the heads,
    attend, then the reverse all-to-all."""
    qq, kk, vv = (x.transpose(1, 2) for x in (q, k, v))
    if "indices" in CU:
        return _padded_attention(qq, kk, vv, scaling), None
    sp = CU.get("sp", 1)
    if sp > 1:
        times = max(sp // kk.shape[2], 1)
        kk, vv = _repeat_kv(kk, times), _repeat_kv(vv, times)
        qq, kk, vv = (SeqAllToAll.apply(x, 2, 1, sp) for x in (qq, kk, vv))
    cu, longest = CU["cu"], CU["max"]
    out = torch.ops.aten._flash_attention_forward(
        qq[0], kk[0], vv[0], cu, cu, longest, longest, 0.0, True, False, scale=scaling
    )[0].unsqueeze(0)
    if sp > 1:
        out = SeqAllToAll.apply(out, 1, 2, sp)
    return out, None


def _padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: Any) -> torch.Tensor:
    """The padded path (``use_remove_padding=False``) as transformers' flash_attention_2 runs it: each of q, k, v
    flattened to (rows·width, heads, dim) and indexed at the real tokens (``_upad_input``), the varlen kernel, then
    the output scattered into zeros of the padded shape (``_pad_input``)."""
    rows, width = q.shape[:2]
    indices, cu, longest = CU["indices"], CU["cu"], CU["max"]
    qq, kk, vv = (x.reshape(-1, *x.shape[2:])[indices] for x in (q, k, v))
    out = torch.ops.aten._flash_attention_forward(qq, kk, vv, cu, cu, longest, longest, 0.0, True, False, scale=scaling)
    padded = torch.zeros(rows * width, *out[0].shape[1:], dtype=out[0].dtype, device=out[0].device)
    padded[indices] = out[0]
    return padded.view(rows, width, *out[0].shape[1:])


def vision_attention(
    module: Any, q: Any, k: Any, v: Any, attention_mask: Any = None, scaling: Any = None, **kw: Any
) -> Any:
    """A VL vision tower's attention as flash_attention_2 runs it: one varlen kernel over every image (or window) of
    the micro-batch, bidirectional, on the ``cu_seq_lens_q`` transformers passes."""
    cu, longest = kw["cu_seq_lens_q"], kw["max_length_q"]
    qq, kk, vv = (x.transpose(1, 2)[0] for x in (q, k, v))
    out = torch.ops.aten._flash_attention_forward(
        qq, kk, vv, cu, cu, longest, longest, 0.0, False, False, scale=scaling
    )
    return out[0].unsqueeze(0), None
