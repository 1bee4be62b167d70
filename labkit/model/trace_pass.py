"""The body of a traced pass (``labkit.model.memory_trace``): the model's inputs as verl feeds them (packed, or
padded rows with their mask), the decoder, verl's log-prob head in each profile's order (packed: legacy the
log-probs first, the engine the entropy first; the padded paths of ``dp_actor`` and the engine) and the update's
backward. ``tr`` is the tracker: each step names the part of the pass (``tr.module``) where an allocation happens."""

from __future__ import annotations

from typing import Any

import torch

from labkit.memory.head_terms import FUSED_CHUNK
from labkit.model.trace_attention import CU
from labkit.model.trace_heads import FlashCrossEntropy, FusedLinearPPO, entropy_of, logprobs_rows


def pass_inputs(seq_lengths: list[int], sp: int, padded: str, width: int, device: str) -> tuple[Any, Any, Any]:
    """The model's inputs and ``CU``: packed, one (1, T/SP) row with positions restarting per sequence (verl's
    rmpad); padded, a (rows, width) batch, each row's real tokens first, and its attention mask."""
    total = sum(seq_lengths)
    cuts = [0]
    for n in seq_lengths:
        cuts.append(cuts[-1] + n)
    if padded:
        rows = len(seq_lengths)
        mask = torch.zeros(rows, width, dtype=torch.long, device=device)
        indices = torch.cat([torch.arange(n, device=device) + r * width for r, n in enumerate(seq_lengths)])
        CU.update(
            cu=torch.tensor(cuts, dtype=torch.int32, device=device),
            max=max(seq_lengths),
            indices=indices,
            lengths=seq_lengths,
        )
        pos = torch.arange(width, device=device).expand(rows, width)
        return torch.zeros(rows, width, dtype=torch.long, device=device), pos, mask
    CU.pop("indices", None), CU.pop("lengths", None)
    local = -(-total // sp)  # verl's ulysses_pad_and_slice_inputs: pad to a multiple of SP, one slice per rank
    if local * sp > total:
        cuts.append(local * sp)
    CU.update(cu=torch.tensor(cuts, dtype=torch.int32, device=device), max=max(seq_lengths), sp=sp)
    ids = torch.zeros(1, local, dtype=torch.long, device=device)
    pos = torch.cat([torch.arange(n, device=device) for n in seq_lengths])[:local].unsqueeze(0)
    return ids, pos, None


def run_pass(
    model: Any, inputs: tuple[Any, Any, Any], update: bool, spec: dict[str, Any], tr: Any, images: Any = None
) -> None:
    """The decoder (a VL model's vision tower first, on ``images``), then verl's head as ``spec`` says (entropy mode,
    temperature, head kernel, fused), then backward of a loss on the log-probs (and the entropy) for an update."""
    images = images or {}
    ids, pos, mask = inputs
    if spec["padded"] and not spec["fused"]:
        return _run_padded(model, inputs, update, spec, tr)
    entropy, temperature, labels = spec["entropy"], spec["temperature"], ids.reshape(-1)
    tr.module = "vision and decoder" if images else "decoder"
    if spec["fused"]:
        hidden = model.model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False, **images)
        hidden = hidden.last_hidden_state.reshape(-1, model.lm_head.weight.shape[1])
        tr.module = "head"
        logp, ent = FusedLinearPPO.apply(hidden, model.lm_head.weight, labels, temperature, FUSED_CHUNK)
        ent = None if entropy == "none" else ent
        del hidden
    else:
        output = model(input_ids=ids, position_ids=pos, use_cache=False, **images)
        logits = output.logits.squeeze(0)  # verl: rmpad squeeze
        tr.module = "head"
        if temperature != 1.0 and spec["temperature_copy"]:  # the engine: a copy (none at 1), the output kept
            logits = logits / temperature
        elif temperature != 1.0:  # legacy: in place
            logits.div_(temperature)
        # flash_attn's backward writes into the logits only when no entropy needs them (both profiles' rmpad path)
        inplace = entropy == "none"
        if spec["profile"] == "legacy":  # dp_actor: the log-probs, then the entropy
            logp = _logprobs(spec["head"], logits, labels, inplace)
            tr.module = "entropy"
            ent = entropy_of(entropy, logits, spec["entropy_chunk"])
        else:  # the engine: the entropy, then the log-probs
            tr.module = "entropy"
            ent = entropy_of(entropy, logits, spec["entropy_chunk"])
            tr.module = "head"
            logp = _logprobs(spec["head"], logits, labels, inplace)
        del logits, output  # the pass returns: the model's output goes before backward
    _backward(update, logp, ent, tr)


def _backward(update: bool, logp: Any, ent: Any, tr: Any) -> None:
    """An update's loss on the log-probs (and the entropy), and its backward."""
    if update:
        loss = -logp.float().mean() + (0 if ent is None else -0.01 * ent.float().mean())
        del logp, ent
        tr.module = "backward"
        loss.backward()


def _run_padded(model: Any, inputs: tuple[Any, Any, Any], update: bool, spec: dict[str, Any], tr: Any) -> None:
    """The padded path's head (``use_remove_padding=False``). Legacy (``dp_actor._forward_micro_batch``): the
    (rows, width, V) logits divided in place, sliced to the response positions, log-probs (flash_attn flattens the
    slice: a copy when rows > 1), then the plain entropy of the slice. The engine (``prepare_model_outputs``): the
    entropy of every padded position, then the real tokens' logits concatenated (a copy) for the log-probs."""
    ids, pos, mask = inputs
    tr.module = "decoder"
    output = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False)
    logits, vocab = output.logits, output.logits.shape[-1]
    tr.module = "head"
    temperature = spec["temperature"]
    if spec["padded"] == "legacy":
        if temperature != 1.0:
            logits.div_(temperature)
        logits = logits[:, -spec["response_length"] - 1 : -1, :]
        labels = ids[:, : logits.shape[1]].reshape(-1)
        flat = logits.reshape(-1, vocab) if spec["head"] == "flash_attn" else logits  # torch: a loop over rows
        logp = _logprobs(spec["head"], flat, labels, True)
        del flat
        tr.module = "entropy"
        ent = entropy_of(spec["entropy"], logits, 0)
    else:
        if temperature != 1.0:
            logits = logits / temperature
        tr.module = "entropy"
        ent = entropy_of(spec["entropy"], logits, 0)
        tr.module = "head"
        real = torch.cat([row[:n] for row, n in zip(logits.unbind(), CU["lengths"])])
        logp = _logprobs(spec["head"], real, ids.reshape(-1)[: real.shape[0]], True)
        del real
    del logits, output
    _backward(update, logp, ent, tr)


def _logprobs(head: str, logits: Any, labels: Any, inplace: bool) -> Any:
    """verl's ``logprobs_from_logits`` on (tokens, V) logits: flash_attn's cross-entropy (``inplace_backward``) or
    the torch rows."""
    if head == "flash_attn":
        return -FlashCrossEntropy.apply(logits, labels, inplace)
    return logprobs_rows(logits, labels)
