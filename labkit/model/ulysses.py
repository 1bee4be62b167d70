"""Ulysses sequence parallelism (DeepSpeed-Ulysses): each SP rank holds a contiguous slice of the packed row; inside
attention an all-to-all trades the sequence split for a head split, so each rank attends over the whole sequence
with heads/sp heads, then a second all-to-all trades back.

Mirrors verl/utils/ulysses.py (group, pad/slice, SeqAllToAll, Gather, gather_outputs_and_unpad) and
verl/models/transformers/monkey_patch.py (apply_monkey_patch's head checks E41/E42, _ulysses_flash_attention_forward).
Here the attention is a transformers ``AttentionInterface`` function named ``labkit_ulysses`` (registered together
with an ``AttentionMaskInterface`` entry, or it would silently receive mask=None), with sdpa and an explicit
block-diagonal causal mask in place of flash-attn varlen. The collectives are ``labkit.model.ulysses_communications``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import ProcessGroup

from labkit.model.ulysses_communications import Gather, SeqAllToAll
from labkit.rules.catalogue import message
from labkit.runtime import dist as ldist

ULYSSES_ATTN = "labkit_ulysses"

_ULYSSES_SEQUENCE_PARALLEL_GROUP: ProcessGroup | None = None


# ---- the module-level SP group ------------------------------------------------------------------------------------
def set_ulysses_sequence_parallel_group(group: ProcessGroup | None) -> None:
    """Set the SP group the attention function uses. Mirrors verl.utils.ulysses.set_ulysses_sequence_parallel_group."""
    global _ULYSSES_SEQUENCE_PARALLEL_GROUP
    _ULYSSES_SEQUENCE_PARALLEL_GROUP = group


def get_ulysses_sequence_parallel_group() -> ProcessGroup | None:
    """The current SP group (None: no SP). Mirrors verl.utils.ulysses.get_ulysses_sequence_parallel_group."""
    return _ULYSSES_SEQUENCE_PARALLEL_GROUP


def get_ulysses_sequence_parallel_world_size(group: ProcessGroup | None = None) -> int:
    """SP size of ``group`` or of the module-level group (1 without one)."""
    group = get_ulysses_sequence_parallel_group() if group is None else group
    return dist.get_world_size(group) if group is not None else 1


def get_ulysses_sequence_parallel_rank(group: ProcessGroup | None = None) -> int:
    """This rank's index in ``group`` or in the module-level group (0 without one)."""
    group = get_ulysses_sequence_parallel_group() if group is None else group
    return dist.get_rank(group) if group is not None else 0


@contextmanager
def ulysses_group(group: ProcessGroup | None) -> Iterator[None]:
    """Use ``group`` as the SP group inside the block, restoring the previous one after.
    Mirrors verl/workers/sharding_manager/fsdp_ulysses.py: FSDPUlyssesShardingManager.__enter__/__exit__."""
    previous = get_ulysses_sequence_parallel_group()
    set_ulysses_sequence_parallel_group(group)
    try:
        yield
    finally:
        set_ulysses_sequence_parallel_group(previous)


# ---- constraints -------------------------------------------------------------------------------------------------
def check_ulysses_heads(num_attention_heads: int, num_key_value_heads: int, ulysses_sp_size: int) -> None:
    """verl's head constraints, same AssertionError text: heads % sp == 0 (E41); kv % sp == 0 or sp % kv == 0 (E42;
    with kv < sp the kv heads are repeated). Mirrors verl/models/transformers/monkey_patch.py: apply_monkey_patch."""
    if num_attention_heads % ulysses_sp_size != 0:
        raise AssertionError(
            f"num_attention_heads {num_attention_heads} must be divisible by ulysses_sp_size {ulysses_sp_size}"
        )
    if not (num_key_value_heads % ulysses_sp_size == 0 or ulysses_sp_size % num_key_value_heads == 0):
        raise AssertionError(
            f"num_key_value_heads {num_key_value_heads} must be divisible by ulysses_sp_size "
            f"{ulysses_sp_size}or vise versa. Upon ulysses_sp_size % num_key_value_heads == 0,"
            f"kv heads are repeated to ensure correctness."
        )


def kv_head_repeats(num_key_value_heads: int, ulysses_sp_size: int) -> int:
    """How often each kv head is replicated before the all-to-all: max(sp // kv, 1) (each rank needs ≥ 1 kv head)."""
    return max(ulysses_sp_size // num_key_value_heads, 1)


# ---- pad and slice the packed row ----------------------------------------------------------------------------------
def ulysses_pad(
    input_ids_rmpad: torch.Tensor, position_ids_rmpad: torch.Tensor | None = None, sp_size: int = 1, pad_value: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Right-pad (1, nnz) ids to a multiple of sp with ``pad_value``; positions get 0..pad-1, so the padding forms its
    own packed segment. Returns (ids, positions, pad_size). Mirrors verl.utils.ulysses.ulysses_pad."""
    if position_ids_rmpad is not None:
        if position_ids_rmpad.size(-2) != 1 or input_ids_rmpad.size(-1) != position_ids_rmpad.size(-1):
            raise ValueError(
                f"position_ids_rmpad {tuple(position_ids_rmpad.shape)} must be (1, nnz) like input_ids_rmpad "
                f"{tuple(input_ids_rmpad.shape)}"
            )
    if sp_size <= 1:
        return input_ids_rmpad, position_ids_rmpad, 0
    pad_size = (sp_size - input_ids_rmpad.size(-1) % sp_size) % sp_size
    if pad_size:
        input_ids_rmpad = F.pad(input_ids_rmpad, (0, pad_size), value=pad_value)
        if position_ids_rmpad is not None:
            extra = torch.arange(pad_size, device=position_ids_rmpad.device, dtype=position_ids_rmpad.dtype)
            extra = extra.expand(*position_ids_rmpad.shape[:-1], pad_size)
            position_ids_rmpad = torch.cat((position_ids_rmpad, extra), dim=-1)
    return input_ids_rmpad, position_ids_rmpad, pad_size


def slice_input_tensor(x: torch.Tensor, dim: int, sp_size: int, sp_rank: int) -> torch.Tensor:
    """SP rank ``sp_rank``'s contiguous part [r·L/sp, (r+1)·L/sp) of ``dim`` (L must divide).
    Mirrors verl.utils.ulysses.slice_input_tensor (padding=False)."""
    if x.size(dim) % sp_size:
        raise ValueError(f"dim {dim} of size {x.size(dim)} is not divisible by sp_size {sp_size}; ulysses_pad first")
    part = x.size(dim) // sp_size
    return x.narrow(dim, sp_rank * part, part).contiguous()


def ulysses_pad_and_slice_inputs(
    input_ids_rmpad: torch.Tensor,
    position_ids_rmpad: torch.Tensor | None = None,
    sp_size: int = 1,
    sp_rank: int | None = None,
    pad_value: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """``ulysses_pad`` then keep this SP rank's slice of ids (and positions). ``sp_rank`` defaults to the rank in the
    module-level SP group. Mirrors verl.utils.ulysses.ulysses_pad_and_slice_inputs."""
    ids, pos, pad_size = ulysses_pad(input_ids_rmpad, position_ids_rmpad, sp_size, pad_value=pad_value)
    if sp_size <= 1:
        return ids, pos, pad_size
    rank = get_ulysses_sequence_parallel_rank() if sp_rank is None else sp_rank
    ids = slice_input_tensor(ids, 1, sp_size, rank)
    if pos is not None:
        pos = slice_input_tensor(pos, pos.dim() - 1, sp_size, rank)
    return ids, pos, pad_size


def gather_outputs_and_unpad(
    x: torch.Tensor,
    gather_dim: int,
    unpad_dim: int | None = None,
    padding_size: int = 0,
    grad_scaler: bool = True,
    group: ProcessGroup | None = None,
) -> torch.Tensor:
    """All-gather per-rank outputs over SP, then strip ``padding_size`` from the end of ``unpad_dim``; ``x`` unchanged
    without an SP group. Mirrors verl.utils.ulysses.gather_outputs_and_unpad."""
    group = get_ulysses_sequence_parallel_group() if group is None else group
    if group is None:
        return x
    x = Gather.apply(group, x, gather_dim, grad_scaler)
    if unpad_dim is not None:
        if not isinstance(padding_size, int):
            raise AssertionError("padding size is not given or is not an integer")
        if padding_size:
            x = x.narrow(unpad_dim, 0, x.size(unpad_dim) - padding_size)
    return x


def gather_outpus_and_unpad(*args: Any, **kwargs: Any) -> torch.Tensor:
    """The old, misspelled name: kept only to raise, as verl keeps it (X7). Mirrors verl.utils.ulysses."""
    raise RuntimeError(message("X7"))


# ---- the attention function ---------------------------------------------------------------------------------------
def packed_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """(bsz, 1, T, T) bool mask: causal within each packed segment (a new segment starts wherever the position does
    not grow by exactly 1, transformers' find_packed_sequence_indices rule), blocked across segments."""
    step = torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1)
    segment = (step != 1).cumsum(-1)
    same = segment[:, :, None] == segment[:, None, :]
    causal = torch.ones(position_ids.shape[-1], position_ids.shape[-1], dtype=torch.bool, device=position_ids.device)
    return (same & causal.tril())[:, None]


def ulysses_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention (q (b, H, s/sp, d), k/v (b, KV, s/sp, d)) → (b, s/sp, H, d). With an SP group: repeat kv
    heads if kv < sp, all-to-all (scatter heads, gather sequence), all-gather position ids, sdpa with the block-diagonal
    causal mask of the whole packed row, all-to-all back. Without one: plain sdpa. Mirrors monkey_patch.py:
    _ulysses_flash_attention_forward."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    group = get_ulysses_sequence_parallel_group()
    sp = get_ulysses_sequence_parallel_world_size(group)
    if sp <= 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("labkit's Ulysses attention has no sliding window; use a full-attention config")
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError("Ulysses attention needs position_ids (the packed row's restarting positions); got None")
    repeats = kv_head_repeats(key.size(1), sp)
    if repeats > 1:
        key, value = key.repeat_interleave(repeats, dim=1), value.repeat_interleave(repeats, dim=1)
    # (b, heads, s/sp, d) -> (b, heads/sp, s, d): scatter the head dim (1), gather the sequence dim (2)
    q, k, v = (SeqAllToAll.apply(group, t, 1, 2) for t in (query, key, value))
    full_pos = torch.cat(ldist.all_gather(position_ids.contiguous(), group), dim=-1)
    mask = packed_causal_mask(full_pos)
    if k.size(1) != q.size(1):  # GQA: each local query head uses kv head (i // groups), as repeat_kv lays them out
        groups = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)
    out = SeqAllToAll.apply(group, out, 2, 1)  # (b, heads/sp, s, d) -> (b, heads, s/sp, d)
    return out.transpose(1, 2).contiguous(), None


def register_ulysses_attention() -> str:
    """Register ``labkit_ulysses`` in BOTH AttentionInterface and AttentionMaskInterface (sdpa_mask); with only the
    first, transformers builds no mask for it and packed rows silently attend across sequences."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ULYSSES_ATTN, ulysses_attention_forward)
    AttentionMaskInterface.register(ULYSSES_ATTN, sdpa_mask)
    return ULYSSES_ATTN


def apply_ulysses_patch(model: torch.nn.Module, ulysses_sp_size: int) -> torch.nn.Module:
    """Check verl's head constraints (E41/E42), register the attention and switch the model to it (in place).
    Mirrors verl/models/transformers/monkey_patch.py: apply_monkey_patch (text models, no fused kernels)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    check_ulysses_heads(config.num_attention_heads, config.num_key_value_heads, ulysses_sp_size)
    model.set_attn_implementation(register_ulysses_attention())
    if model.config._attn_implementation != ULYSSES_ATTN:
        raise RuntimeError(f"could not switch {type(model).__name__} to attention {ULYSSES_ATTN!r}")
    return model
