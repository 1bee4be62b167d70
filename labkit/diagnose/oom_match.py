"""Which tensor a failed allocation is: the request PyTorch printed against the single tensors of the failing
phase as labkit's memory model sizes them (the logits, an fp32 T × V copy, a chunk, the LM head's gradient, the KV
pool, ...), within the printed rounding; without a config, the T × V factorisations it is consistent with."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.memory.head_terms import FUSED_CHUNK, head_tokens
from labkit.memory.model_catalogue import model_names, model_shape
from labkit.memory.phase_records import PassShape, Phase
from labkit.memory.settings import MemorySettings

LARGE_ROUND = 2 * 2**20
"""PyTorch's caching allocator rounds a large request up to a multiple of 2 MiB before it prints it."""
GiB = 2**30


@dataclass(frozen=True)
class Tensor:
    """One tensor of a phase: what it is, its bytes, and the arithmetic that sizes it."""

    what: str
    bytes: int
    arithmetic: str


def bounds(requested: int) -> tuple[int, int]:
    """The tensor sizes a printed request can stand for: PyTorch rounds a large request up by under 2 MiB, then
    prints two decimals (half a hundredth of the unit either way)."""
    half = (GiB if requested >= GiB else 2**20) // 200 + 1
    return requested - LARGE_ROUND - half, requested + half


def phase_tensors(s: MemorySettings, name: str, phase: Phase) -> list[Tensor]:
    """The single large tensors of ``phase`` (one GPU, its largest micro-batch) as the memory model sizes them."""
    m, b = s.model, s.compute_bytes
    if name == "generate":
        kv = phase.instants["engine"].get("kv_cache", 0)
        out = [Tensor("the engine's KV-cache pool", kv, f"u·C − weights − activations = {kv / GiB:.2f} GiB")]
        logits = s.max_num_seqs * m.vocab_size * 4
        out.append(Tensor("the sampler's fp32 logits", logits, f"{s.max_num_seqs} seqs × {m.vocab_size:,} × 4 B"))
        return out
    if name == "weight_sync":
        p = m.param_count()
        return [Tensor("the full weights in bf16", p * b, f"{p:,} params × {b} B")]
    tokens, rows = int(phase.info["tokens"]), int(phase.info.get("rows") or 1)
    v = 1 if name in ("values", "update_critic") else m.vocab_size
    th = head_tokens(s, PassShape(rows, tokens), v)
    out = [
        Tensor("the logits", tokens * v * b, f"{tokens:,} tokens × {v:,} vocab × {b} B"),
        Tensor(
            "an fp32 T × V tensor: the entropy's softmax or product, an autocast copy, a log-softmax",
            th * v * 4,
            f"{th:,} tokens × {v:,} vocab × 4 B",
        ),
        Tensor(
            "the LM head's weight gradient",
            m.vocab_size * m.hidden_size * b,
            f"{m.vocab_size:,} × {m.hidden_size:,} × {b} B",
        ),
        Tensor("an MLP activation", tokens * m.intermediate_size * b, f"{tokens:,} × {m.intermediate_size:,} × {b} B"),
        Tensor(
            "an fp32 MLP activation", tokens * m.intermediate_size * 4, f"{tokens:,} × {m.intermediate_size:,} × 4 B"
        ),
    ]
    if th != tokens:
        out.append(Tensor("the response positions' logits", th * v * b, f"{th:,} tokens × {v:,} vocab × {b} B"))
    if s.entropy_mode == "chunked":
        c = min(tokens, s.entropy_chunk_size)
        out.append(Tensor("one entropy chunk in fp32", c * v * 4, f"{c:,} rows × {v:,} × 4 B"))
    if s.fused_kernels:
        c = min(tokens, FUSED_CHUNK)
        out.append(Tensor("one fused-kernel chunk in fp32", c * v * 4, f"{c:,} rows × {v:,} × 4 B"))
    return [t for t in out if t.bytes > 0]


def match(requested: int, tensors: list[Tensor]) -> Tensor | None:
    """The tensor the request is for, within ``bounds``; None when none is."""
    low, high = bounds(requested)
    near = [t for t in tensors if low <= t.bytes <= high]
    return min(near, key=lambda t: abs(requested - t.bytes)) if near else None


def _roundness(n: int) -> int:
    return (n & -n).bit_length() - 1 if n > 0 else 0


def factorisations(requested: int, vocab: int | None = None) -> list[Tensor]:
    """T × V × B products the request is consistent with: B = 2 (bf16 logits) or 4 (fp32), V the model's vocabulary
    (or, unknown, the known vocabulary giving the roundest T), T the roundest token count in range (a multiple of 64
    at least). A hypothesis, not a match: the caller says so."""
    vocabs = [vocab] if vocab else sorted({model_shape(n).vocab_size for n in model_names()} - {0})
    lowest, highest = bounds(requested)
    found: dict[int, list[tuple[int, Tensor]]] = {}
    for v in (v for v in vocabs if v >= 32000 or vocab):
        for width, what in ((2, "bf16 logits"), (4, "an fp32 T × V tensor (softmax, autocast copy, log-softmax)")):
            low, high = -(-lowest // (v * width)), highest // (v * width)
            if high < max(low, 1):
                continue
            tokens = max(range(max(low, 1), high + 1), key=_roundness)
            if _roundness(tokens) >= 6:
                tensor = Tensor(what, tokens * v * width, f"{tokens:,} tokens × {v:,} vocab × {width} B")
                found.setdefault(v, []).append((_roundness(tokens), tensor))
    if not found:
        return []
    best = max(found, key=lambda v: max(r for r, _ in found[v]))
    return [t for _, t in sorted(found[best], key=lambda rt: -rt[0])]
