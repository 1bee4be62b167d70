"""The log-prob head's and the entropy's transient terms of one pass (the logits, their copies and the entropy's fp32
tensors, verl's fused kernel one chunk at a time), for the forward-only passes and the update's backward. Mirrors
``verl/utils/torch_functional.py: logprobs_from_logits`` / ``entropy_from_logits`` and ``verl/utils/experimental/
torch_functional.py: FusedLinearForPPO``; each size is the fake-CUDA trace's (``labkit.model.trace_heads``).
"""

from __future__ import annotations

from labkit.memory.logprob import logprob_peak_bytes
from labkit.memory.phase_records import PassShape
from labkit.memory.settings import MemorySettings

FUSED_CHUNK = 512  # verl FusedLinearForPPO: tokens per chunk of the fused log-prob kernel


def padded_head(s: MemorySettings, shape: PassShape, vocab: int) -> bool:
    return not s.remove_padding and not s.fused_kernels and vocab > 1


def head_tokens(s: MemorySettings, shape: PassShape, vocab: int) -> int:
    """Th: the rows the log-probs and the entropy run on; legacy's padded head slices each row's response
    positions (``logits[:, -response_length - 1 : -1]``), everywhere else every token fed."""
    if padded_head(s, shape, vocab) and s.profile == "legacy":
        return min(shape.tokens, shape.rows * s.response_length)
    return shape.tokens


def unpadded(s: MemorySettings, shape: PassShape, vocab: int) -> dict[str, int]:
    """The padded path's copy of the logits the log-probs read: legacy's flash_attn head flattens the response slice
    (a copy when there are several rows); the engine concatenates the real tokens' rows."""
    if not padded_head(s, shape, vocab):
        return {}
    if s.profile == "legacy":
        copied = shape.rows > 1 and s.logprob_kernel == "flash_attn"
        return {"unpadded_logits": head_tokens(s, shape, vocab) * vocab * s.compute_bytes} if copied else {}
    return {"unpadded_logits": (shape.real_tokens or shape.tokens) * vocab * s.compute_bytes}


def head(s: MemorySettings, shape: PassShape, vocab: int) -> dict[str, int]:
    """The log-prob head of a forward-only pass: the logits in the compute dtype (flash_attn's or torch's head add no
    T×V tensor under no_grad), the padded path's copy, labkit's CPU head its fp32 upcast and log-softmax, the fused
    kernel one chunk."""
    b, tokens = s.compute_bytes, shape.tokens
    if s.fused_kernels and vocab > 1:
        return {"fused_chunk": fused_forward_chunk(s, tokens)}
    logits = {"logits": tokens * vocab * b, **temperature_copy(s, tokens, vocab), **unpadded(s, shape, vocab)}
    if s.logprob_kernel != "full_log_softmax" or vocab == 1:
        return logits
    return {**logits, "log_softmax": logprob_peak_bytes(tokens, vocab, b) - tokens * vocab * b}


def fp32_copy(s: MemorySettings) -> int:
    """Bytes a logit's fp32 upcast takes under autocast (none when the compute dtype is fp32 already)."""
    return 4 if s.compute_bytes < 4 else 0


def fused_forward_chunk(s: MemorySettings, tokens: int) -> int:
    """verl's fused head (FusedLinearForPPO, torch backend), one chunk: fp32 logits, softmax and p·z (traced)."""
    return min(tokens, FUSED_CHUNK) * s.model.vocab_size * (fp32_copy(s) + 8)


def temperature_copy(s: MemorySettings, tokens: int, vocab: int) -> dict[str, int]:
    return {"temperature_copy": tokens * vocab * s.compute_bytes} if s.temperature_copy and vocab > 1 else {}


def entropy(s: MemorySettings, tokens: int) -> int:
    """The forward entropy's tensors beyond the logits (no_grad, or what the forward holds at its peak)."""
    v, mode = s.model.vocab_size, s.entropy_mode
    if mode == "fused":
        return 0
    if mode == "compiled":  # inductor's fused kernel: three (T, 1) fp32 statistics and the (T,) result
        return 16 * tokens
    if mode == "chunked":  # fp32 copy, softmax and p·z of one chunk
        return min(tokens, s.entropy_chunk_size) * v * (fp32_copy(s) + 8)
    # eager (and checkpointed's forward): the softmax and p·z (or logsumexp's fp32 input), fp32 under autocast
    return 2 * tokens * v * (4 if s.autocast else s.compute_bytes)


def logsumexp_temp(s: MemorySettings, tokens: int) -> dict[str, int]:
    """The eager entropy's third fp32 T×V tensor under autocast: at ``logsumexp`` the softmax and the fp32 copy of
    the logits autocast made for it are alive while ATen's composite (``ReduceOps.cpp: logsumexp_out_impl``)
    allocates ``(x - max).exp_()``, a temporary of the input's size (traced: 2 + 4 + 4 + 4 bytes a logit). Without
    autocast there is no copy, and the temporary takes only the product's place. The chunked form's fp32 chunk is
    its own copy (already in ``entropy``)."""
    if s.entropy_mode not in ("eager", "checkpointed") or not s.autocast or s.compute_bytes >= 4:
        return {}
    return {"logsumexp_temp": 4 * tokens * s.model.vocab_size}


def entropy_backward(s: MemorySettings, shape: PassShape) -> dict[str, int]:
    """The update's head backward with the entropy (traced): what the entropy saved, its backward's fp32
    temporaries (the softmax and logsumexp backward: a product, a difference, an exp, a product) and the logits'
    gradients, over the Th rows the entropy ran on. Legacy computes the log-probs first, so what they saved waits
    for their backward, which runs after the entropy's (the engine computes the entropy first)."""
    v, b, mode = s.model.vocab_size, s.compute_bytes, s.entropy_mode
    tokens, logit = head_tokens(s, shape, v), shape.tokens * v * s.compute_bytes
    if mode == "compiled":  # the kernel's logits gradient, the cross-entropy's (in the logits) and their sum
        return {"logits": logit, "logits_grad": 2 * logit}
    held: dict[str, int] = {}
    if s.profile == "legacy" and s.logprob_kernel == "torch":
        held = {"log_softmax_rows": 4 * tokens * v}
    elif s.profile == "legacy":  # flash_attn's input: the logits (packed) or legacy's padded copy
        held = unpadded(s, shape, v) if padded_head(s, shape, v) else {"logits": logit}
    width = 4 if s.autocast else b  # the entropy's tensors are fp32 under autocast
    saved = {"entropy_saved": 2 * width * tokens * v}  # the fp32 copy and the softmax, saved for backward
    grad = tokens * v * b  # the gradient of the rows the entropy ran on
    if mode == "chunked":  # every chunk's copy and softmax are saved; the backward runs a chunk at a time
        rows = min(tokens, s.entropy_chunk_size)
        return {"logits": logit, **held, **saved, "entropy_backward": 4 * width * rows * v, "logits_grad": grad}
    # the checkpoint keeps its input (every row's logits) for the recompute
    kept = {"logits": logit} if mode == "checkpointed" else {}
    return {**kept, **held, **saved, "entropy_backward": 4 * width * tokens * v, "logits_grad": grad}


def fused_backward_chunk(s: MemorySettings, tokens: int, entropy: bool) -> int:
    """verl's fused head's backward, one chunk: the recomputed logits (bf16 and fp32), the softmax, the one-hot, the
    gradient's fp32 products and its bf16 cast (traced: FusedLinearForPPO's backward; the entropy's terms reuse the
    one-hot's and the difference's memory, 2 bytes a logit more)."""
    per_logit = s.compute_bytes + fp32_copy(s) + (20 if entropy else 18)
    return min(tokens, FUSED_CHUNK) * s.model.vocab_size * per_logit
