"""Per-token log-probs (and entropy) of the response tokens of one micro-batch: the per-rank compute of
compute_log_prob (old / ref log-probs, under no_grad) and of update_policy (with grads).

Two paths, as verl's legacy actor has them: padded (full (bsz, seqlen, V) logits, response positions sliced) and
rmpad (the real tokens packed into one row, optionally split over a Ulysses SP group, results scattered back to
(bsz, seqlen) and sliced). Logits at position t predict token t+1, so the response's log-probs sit at
``[:, -R-1:-1]``. Mirrors verl/workers/actor/dp_actor.py: DataParallelPPOActor._forward_micro_batch (text models,
no fused kernels, no prefix grouper).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from labkit.model.logits import entropy_from_logits, logprobs_from_logits, logprobs_from_logits_chunked
from labkit.model.packing import pack_micro_batch, packed_forward
from labkit.model.ulysses import (
    ULYSSES_ATTN,
    gather_outputs_and_unpad,
    ulysses_group,
    ulysses_pad_and_slice_inputs,
)

__all__ = ["forward_micro_batch", "entropy_from_logits_chunked", "E12_SP_NEEDS_RMPAD", "DEFAULT_CHUNK_SIZE"]

DEFAULT_CHUNK_SIZE = 2048  # rows per chunk, verl's entropy_from_logits_with_chunking default
E12_SP_NEEDS_RMPAD = "When using sequence parallelism for actor/ref policy, you must enable `use_remove_padding`."
_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def entropy_from_logits_chunked(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Entropy row-chunk by row-chunk in fp32, so the softmax temporaries are chunk × V.
    Mirrors verl/utils/torch_functional.py: entropy_from_logits_with_chunking."""
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [entropy_from_logits(flat[s : s + chunk_size].float()) for s in range(0, flat.shape[0], chunk_size)]
    return torch.cat(parts).view(logits.shape[:-1])


def _logprob_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    calculate_entropy: bool,
    chunked: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log p(label) and entropy of softmax(logits / T). Naive: verl's in-place ``div_`` then log_softmax + gather;
    chunked: fp32 chunk × V temporaries only (the logits are not modified)."""
    if chunked:
        log_probs = logprobs_from_logits_chunked(logits, labels, chunk_size, temperature=temperature)
        if not calculate_entropy:
            return log_probs, None
        scaled = logits / temperature
        return log_probs, entropy_from_logits_chunked(scaled, chunk_size)
    logits.div_(temperature)
    log_probs = logprobs_from_logits(logits, labels)
    return log_probs, entropy_from_logits(logits) if calculate_entropy else None


def _sp_size(sp_group: ProcessGroup | None) -> int:
    return dist.get_world_size(sp_group) if sp_group is not None else 1


def _check(model: torch.nn.Module, micro: Mapping[str, torch.Tensor], use_remove_padding: bool, sp: int) -> None:
    missing = [k for k in _KEYS if k not in micro]
    if missing:
        raise KeyError(f"micro-batch lacks {missing}; forward_micro_batch needs {list(_KEYS)}")
    if micro["responses"].size(-1) >= micro["input_ids"].size(-1):
        raise ValueError(
            f"responses width {micro['responses'].size(-1)} must be smaller than input_ids width "
            f"{micro['input_ids'].size(-1)} (prompt + response)"
        )
    if sp > 1 and not use_remove_padding:
        raise ValueError(E12_SP_NEEDS_RMPAD)
    if sp > 1 and getattr(model.config, "_attn_implementation", None) != ULYSSES_ATTN:
        raise ValueError(
            f"Ulysses SP={sp} needs the model's attention to be {ULYSSES_ATTN!r} "
            f"(got {getattr(model.config, '_attn_implementation', None)!r}): call "
            f"labkit.model.ulysses.apply_ulysses_patch(model, {sp}) first"
        )


def _forward_padded(model, micro, response_length, temperature, calculate_entropy, chunked, chunk_size):
    """Full (bsz, seqlen, V) logits with the attention mask; slice the response positions."""
    output = model(
        input_ids=micro["input_ids"],
        attention_mask=micro["attention_mask"],
        position_ids=micro["position_ids"],
        use_cache=False,
    )
    logits = output.logits
    if not chunked:  # verl: in place on the full logits, then slice
        logits.div_(temperature)
        temperature = 1.0
    logits = logits[:, -response_length - 1 : -1, :]
    return _logprob_entropy(logits, micro["responses"], temperature, calculate_entropy, chunked, chunk_size)


def _response_positions(packed, log_probs, entropy, response_length):
    """Per-token outputs in packed order, scattered back to (bsz, seqlen) and sliced to the response positions."""
    log_probs = packed.pad_back(log_probs)[:, -response_length - 1 : -1]
    if entropy is not None:
        entropy = packed.pad_back(entropy)[:, -response_length - 1 : -1]
    return log_probs, entropy


def _forward_right_padded(model, micro, response_length, temperature, calculate_entropy, chunked, chunk_size):
    """Engine without rmpad: each row's real tokens left-aligned and right-padded to the micro-batch's longest row
    (``torch.nested.to_padded_tensor``), forward with that mask; the real positions' logits in packed order then
    take the rmpad path's labels and scatter. Mirrors verl/workers/engine/fsdp/transformer_impl.py:
    FSDPEngineWithLMHead.prepare_model_inputs (use_remove_padding=False)."""
    packed = pack_micro_batch(micro["input_ids"], micro["attention_mask"], micro["position_ids"])
    lens = micro["attention_mask"].sum(-1)
    valid = torch.arange(int(lens.max()) if lens.numel() else 0, device=lens.device)[None, :] < lens[:, None]
    ids = packed.input_ids.new_zeros(valid.shape)
    pos = packed.position_ids.new_zeros(valid.shape)
    ids[valid], pos[valid] = packed.input_ids[0], packed.position_ids[0]  # row-major, as the packed order
    logits = model(input_ids=ids, attention_mask=valid.long(), position_ids=pos, use_cache=False).logits[valid]
    log_probs, entropy = _logprob_entropy(
        logits, packed.labels.squeeze(0), temperature, calculate_entropy, chunked, chunk_size
    )
    return _response_positions(packed, log_probs, entropy, response_length)


def _forward_rmpad(model, micro, response_length, sp_group, temperature, calculate_entropy, chunked, chunk_size):
    """Pack, (pad and slice over SP), forward with attention_mask=None and use_cache=False, log-probs of the rolled
    labels, (gather over SP and unpad), scatter back to (bsz, seqlen) and slice the response positions."""
    sp = _sp_size(sp_group)
    packed = pack_micro_batch(micro["input_ids"], micro["attention_mask"], micro["position_ids"])
    ids, pos, labels = packed.input_ids, packed.position_ids, packed.labels
    all_zero = packed.nnz == 0
    if all_zero:  # verl feeds sp dummy tokens and drops their outputs
        ids = torch.zeros((1, sp), dtype=ids.dtype, device=ids.device)
        pos = torch.zeros((1, sp), dtype=pos.dtype, device=pos.device)
        labels = ids
    pad_size = 0
    if sp > 1:
        sp_rank = dist.get_rank(sp_group)
        ids, pos, pad_size = ulysses_pad_and_slice_inputs(ids, pos, sp_size=sp, sp_rank=sp_rank)
        labels, _, _ = ulysses_pad_and_slice_inputs(labels, None, sp_size=sp, sp_rank=sp_rank)
    logits = packed_forward(model, ids, pos).logits.squeeze(0)  # (nnz/sp + pad, V)
    log_probs, entropy = _logprob_entropy(
        logits, labels.squeeze(0), temperature, calculate_entropy, chunked, chunk_size
    )
    if sp > 1:
        log_probs = gather_outputs_and_unpad(log_probs, 0, 0, pad_size, group=sp_group)
        if entropy is not None:
            entropy = gather_outputs_and_unpad(entropy, 0, 0, pad_size, group=sp_group)
    if all_zero:
        log_probs = log_probs[:0]
        entropy = entropy[:0] if entropy is not None else None
    return _response_positions(packed, log_probs, entropy, response_length)


def forward_micro_batch(
    model: torch.nn.Module,
    micro: Mapping[str, torch.Tensor],
    *,
    use_remove_padding: bool,
    sp_group: ProcessGroup | None = None,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    chunked: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    autocast_dtype: torch.dtype | None = None,
    pad_to_longest: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log_probs (bsz, R), entropy (bsz, R) or None) of ``micro``'s responses under ``softmax(logits / T)``.

    ``micro`` holds input_ids, attention_mask, position_ids (bsz, seqlen) and responses (bsz, R); positions past a
    row's real tokens hold garbage (0 on the rmpad path), mask them with the response mask. ``sp_group`` (size > 1)
    splits the packed row over Ulysses SP ranks, which must all call this with the same micro-batch; it is the
    module-level SP group for the duration of the call. Works under ``torch.no_grad`` and with grads.
    ``pad_to_longest`` (rmpad off): the engine's layout, rows right-padded to the micro-batch's longest row, instead
    of dp_actor's full rollout width.
    Mirrors verl/workers/actor/dp_actor.py: DataParallelPPOActor._forward_micro_batch."""
    sp = _sp_size(sp_group)
    _check(model, micro, use_remove_padding, sp)
    response_length = micro["responses"].size(-1)
    device_type = micro["input_ids"].device.type
    amp = torch.autocast(device_type=device_type, dtype=autocast_dtype) if autocast_dtype else nullcontext()
    with amp, ulysses_group(sp_group if sp > 1 else None):
        if use_remove_padding:
            return _forward_rmpad(
                model,
                micro,
                response_length,
                sp_group if sp > 1 else None,
                temperature,
                calculate_entropy,
                chunked,
                chunk_size,
            )
        if pad_to_longest:
            return _forward_right_padded(
                model, micro, response_length, temperature, calculate_entropy, chunked, chunk_size
            )
        return _forward_padded(model, micro, response_length, temperature, calculate_entropy, chunked, chunk_size)
