"""Padding removal ("rmpad"): pack a padded micro-batch into one (1, nnz) row of real tokens and scatter results back.

verl's ``use_remove_padding`` path packs every real token of a micro-batch into a single row whose position ids restart
at 0 for each sequence; the model then attends block-diagonally (flash-attn varlen on GPU; in transformers ≥ 4.54 the
packed-sequence detection, which needs ``attention_mask=None``, position ids that restart, and ``use_cache=False``).
Mirrors verl/utils/attention_utils.py (unpad_input, pad_input, index_first_axis: the flash_attn.bert_padding helpers)
and the packing steps of verl/workers/actor/dp_actor.py: DataParallelPPOActor._forward_micro_batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "index_first_axis",
    "unpad_input",
    "pad_input",
    "compute_position_id_with_mask",
    "PackedBatch",
    "pack_micro_batch",
    "packed_forward",
]


def index_first_axis(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows ``indices`` of the first axis (autograd-friendly gather). Mirrors verl attention_utils.index_first_axis."""
    if tensor.dim() < 2:
        raise ValueError(f"index_first_axis needs a tensor with >= 2 dims, got shape {tuple(tensor.shape)}")
    return tensor[indices]


def unpad_input(
    hidden_states: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(bsz, seqlen, ...) + mask → (nnz, ...) real rows, flat indices, cu_seqlens (int32, leading 0), max seqlen,
    per-row lengths. Row-major order, so each sequence's tokens stay contiguous. Mirrors verl attention_utils.unpad_input."""
    if attention_mask.dim() != 2 or hidden_states.shape[:2] != attention_mask.shape:
        raise ValueError(
            f"attention_mask must be (bsz, seqlen) matching hidden_states' first two dims; got "
            f"{tuple(attention_mask.shape)} and {tuple(hidden_states.shape)}"
        )
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, int(seqlens.max().item()), seqlens


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Scatter (nnz, ...) rows back to (batch, seqlen, ...), zeros at padding. Mirrors verl attention_utils.pad_input."""
    if hidden_states.shape[0] != indices.numel():
        raise ValueError(f"pad_input: {hidden_states.shape[0]} rows but {indices.numel()} indices")
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out[indices] = hidden_states
    return out.view(batch, seqlen, *hidden_states.shape[1:])


def compute_position_id_with_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on each row's first real token (left padding gets 0).
    Mirrors verl/utils/model.py: compute_position_id_with_mask."""
    return torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0, max=None)


@dataclass
class PackedBatch:
    """One packed micro-batch: ids/positions/labels (1, nnz), where each real token came from (``indices`` into the
    flattened (bsz, seqlen) grid), sequence boundaries ``cu_seqlens`` and the original shape."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    batch_size: int
    seqlen: int

    @property
    def nnz(self) -> int:
        """Real tokens in the micro-batch (the packed row's length)."""
        return int(self.indices.numel())

    def pad_back(self, values: torch.Tensor) -> torch.Tensor:
        """(nnz,) per-token values → (bsz, seqlen), zeros at padding (``pad_input`` on a trailing singleton dim)."""
        return pad_input(values.unsqueeze(-1), self.indices, self.batch_size, self.seqlen).squeeze(-1)


def pack_micro_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> PackedBatch:
    """Pack real tokens into (1, nnz) with the batch's own (restarting) position ids; labels = ids rolled left by one,
    so label[t] is the next packed token (wrong only at a sequence's last token, which no response log-prob uses).
    Mirrors the rmpad preamble of dp_actor._forward_micro_batch (text models: 2-D position ids)."""
    if position_ids.dim() != 2:
        raise ValueError(f"text models only: position_ids must be (bsz, seqlen), got {tuple(position_ids.shape)}")
    if input_ids.shape != attention_mask.shape or input_ids.shape != position_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and position_ids "
            f"{tuple(position_ids.shape)} must have one shape"
        )
    bsz, seqlen = input_ids.shape
    ids_rmpad, indices, cu_seqlens, max_seqlen, _ = unpad_input(input_ids.unsqueeze(-1), attention_mask)
    ids_rmpad = ids_rmpad.transpose(0, 1)  # (1, nnz)
    pos_rmpad = index_first_axis(position_ids.reshape(-1, 1), indices).transpose(0, 1)
    labels = torch.roll(ids_rmpad, shifts=-1, dims=1)
    return PackedBatch(ids_rmpad, pos_rmpad, labels, indices, cu_seqlens, max_seqlen, bsz, seqlen)


def packed_forward(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, **kwargs) -> object:
    """The model on a packed row: ``attention_mask=None`` and ``use_cache=False`` (with a cache, transformers skips
    packed-sequence detection and the sequences silently attend to each other)."""
    return model(input_ids=input_ids, attention_mask=None, position_ids=position_ids, use_cache=False, **kwargs)
