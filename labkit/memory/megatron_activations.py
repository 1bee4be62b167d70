"""Megatron's activations per pipeline stage: what megatron-core's layers save per micro-batch, how many micro-batches
the schedule keeps in flight (``megatron/core/pipeline_parallel/schedules.py``), recompute
(``override_transformer_config.recompute_*``), the buffers alive through a pass, and verl's head on the last stage
(``verl/workers/engine/megatron/transformer_impl.py: MegatronEngine._lm_head_logits_processor``). Part of
``labkit.memory.megatron_memory``; the witness is ``labkit.model.trace_megatron``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from labkit.memory.megatron_params import widths
from labkit.memory.megatron_stages import is_moe_layer, moe_of, stage_layers
from labkit.memory.shapes import ModelShape
from labkit.rules.parallel_layout import ParallelLayout

SELECTIVE = ("core_attn", "layernorm", "mlp", "moe_act", "moe", "shared_experts")


@dataclass(frozen=True)
class Recompute:
    """``override_transformer_config.recompute_*`` (verl's defaults: no recompute; modules [core_attn])."""

    granularity: str | None = None
    """None | ``full`` | ``selective``."""
    method: str | None = None
    """``uniform`` | ``block`` (full only)."""
    num_layers: int | None = None
    """Layers per checkpointed group (uniform) or checkpointed layers per chunk (block)."""
    modules: tuple[str, ...] = ("core_attn",)
    """Selective only: which submodules are recomputed."""

    def check(self) -> None:
        if self.granularity not in (None, "full", "selective"):
            raise ValueError(f"recompute_granularity must be null, full or selective, not {self.granularity!r}")
        if self.granularity == "full" and (self.method not in ("uniform", "block") or not self.num_layers):
            raise ValueError(
                "recompute_granularity=full needs recompute_method (uniform|block) and recompute_num_layers"
            )
        bad = [m for m in self.modules if m not in SELECTIVE]
        if self.granularity == "selective" and bad:
            raise ValueError(f"unknown recompute_modules {bad}; known: {', '.join(SELECTIVE)}")


def in_flight(layout: ParallelLayout, stage: int, micro_batches: int) -> int:
    """Chunk-forwards whose activations wait for their backward at the stage's peak: 1 without pipelining;
    min(PP − r, Mμ) under 1F1B; interleaved: min(warmup + 1, Mμ·V), warmup = 2(PP − r − 1) + (V − 1)·G with
    G = PP, megatron-core's default (``schedules.py: get_pp_rank_microbatches``; the same count as
    ``labkit.plan.pipeline_schedule``, which tests compare)."""
    pp, v, mb = layout.pp, layout.vpp or 1, micro_batches
    if pp == 1:
        return 1
    if v == 1:
        return min(pp - stage, mb)
    return min(min(2 * (pp - stage - 1) + (v - 1) * pp, mb * v) + 1, mb * v)


def saved_layer_bytes(m: ModelShape, index: int, layout: ParallelLayout, t: int, rc: Recompute) -> tuple[int, int]:
    """What autograd keeps of one layer for one micro-batch of t tokens: (dense part, routed-expert part).
    Sequence-parallel tensors ([t/s, H]): the two residual streams (each norm's input), the two norm outputs (the
    column-parallel linears save them un-gathered), the norms' fp32 rstd; TP tensors ([t, ·/TP]): the qkv output,
    the RoPE'd q and k (and q/k norm outputs), flash attention's output and fp32 softmax_lse, the fc1 output (the
    fused SwiGLU's input) and the SwiGLU output (fc2's input)."""
    h, q, kv, i, p = widths(m, layout.tp)
    s = p if layout.sequence_parallel else 1
    sel = rc.modules if rc.granularity == "selective" else ()
    hidden = 2 * h * t // s
    out = 2 * hidden
    if "layernorm" not in sel:
        out += 2 * hidden + 2 * 4 * t // s
    out += 2 * t * (q + 2 * kv) + 2 * t * (q + kv) * (2 if m.qk_norm else 1) + 2 * t * q
    if "core_attn" not in sel:
        out += 4 * t * m.num_attention_heads // p
    moe = moe_of(m)
    if moe is None or not is_moe_layer(m, index):
        return out + (0 if "mlp" in sel else 6 * t * i // p), 0
    return out, routed_expert_bytes(m, layout, t, sel)


def routed_tokens(m: ModelShape, layout: ParallelLayout, t: int) -> int:
    """Token copies one rank's experts run on, balanced routing: k·t/s after the all-to-all, times ETP after the
    expert-TP all-gather (``megatron/core/transformer/moe/token_dispatcher.py: MoEAlltoAllTokenDispatcher``)."""
    moe = moe_of(m)
    s = layout.tp if layout.sequence_parallel else 1
    return moe.num_experts_per_tok * (t // s) * layout.etp


def routed_expert_bytes(m: ModelShape, layout: ParallelLayout, t: int, sel: tuple[str, ...] = ()) -> int:
    """One MoE layer's saved tensors for t tokens: the router's fp32 probabilities [t/s, E], the experts' input
    after the dispatch [routed, H], their fc1 [routed, 2·Im/ETP] and SwiGLU [routed, Im/ETP] outputs; the shared
    expert like a dense MLP of its width (TP-split)."""
    if "moe" in sel:
        return 0
    moe = moe_of(m)
    s = layout.tp if layout.sequence_parallel else 1
    routed, im = routed_tokens(m, layout, t), moe.moe_intermediate_size // layout.etp
    out = 4 * (t // s) * moe.num_experts + 2 * routed * m.hidden_size
    out += 2 * routed * im * (2 if "moe_act" in sel else 3)
    if moe.shared_expert_intermediate_size and "shared_experts" not in sel:
        out += 6 * t * moe.shared_expert_intermediate_size // layout.tp
    return out


def hidden_bytes(m: ModelShape, layout: ParallelLayout, t: int) -> int:
    """One [t/s, H] bf16 tensor: the residual stream between layers and stages."""
    return 2 * m.hidden_size * t // (layout.tp if layout.sequence_parallel else 1)


def backward_transient(m: ModelShape, layout: ParallelLayout, t: int, layers: list[int]) -> int:
    """One layer's backward temporaries at its MLP, the largest over the stage's layers: dense, the gradient of the
    fc1 output [t, 2I/p] and of the SwiGLU output [t, I/p], less the SwiGLU output fc2's backward has released
    (4t·I/p); MoE, four [routed, H] tensors: the experts' outputs,
    their concatenation, the permutation's gather and the all-to-all's receive (and the shared expert's, dense-like).
    """
    out = [0]
    moe = moe_of(m)
    for sparse in {is_moe_layer(m, index) for index in layers}:
        if sparse:
            shared = 6 * t * moe.shared_expert_intermediate_size // layout.tp
            out.append(8 * routed_tokens(m, layout, t) * m.hidden_size + shared)
        else:
            out.append(4 * t * m.intermediate_size // layout.tp)
    return max(out)


def forward_working_set(m: ModelShape, layout: ParallelLayout, t: int, layers: list[int]) -> int:
    """forward_only: one layer's MLP under no_grad, the largest over the stage's layers: the fc1 and SwiGLU
    outputs (dense [t, 3I/p]; MoE five [routed, H] tensors: the permuted copies, the all-to-all's receive, the
    experts' sorted input, their outputs and its concatenation; each expert's fc1 and SwiGLU live one expert at a
    time) plus five [t/s, H] residual-stream tensors (layer input, attention residual, norm output, MLP output, the
    sum)."""
    out = [0]
    moe = moe_of(m)
    for sparse in {is_moe_layer(m, index) for index in layers}:
        if sparse:
            routed = routed_tokens(m, layout, t)
            out.append(10 * routed * m.hidden_size + 6 * t * moe.shared_expert_intermediate_size // layout.tp)
        else:
            out.append(4 * t * m.intermediate_size // layout.tp)
    return max(out) + 5 * hidden_bytes(m, layout, t)


def stage_activations(m: ModelShape, layout: ParallelLayout, stage: int, inp: StageInputs) -> dict[str, int]:
    """Saved activations of the stage's in-flight micro-batches at its peak (training): per micro-batch every
    layer's saved tensors (full recompute: each checkpointed group's input instead) plus the stage boundary; and,
    with full recompute, the group the backward re-runs."""
    return dict(_stage_activations(m, layout, stage, inp))


@lru_cache(maxsize=1024)
def _stage_activations(m: ModelShape, layout: ParallelLayout, stage: int, inp: StageInputs) -> tuple:
    chunks = stage_layers(m, layout, stage)
    n, rc, t = in_flight(layout, stage, inp.micro_batches), inp.recompute, inp.tokens
    per_chunk: list[tuple[int, int, int]] = []  # (dense saved, routed saved, recomputed group) per chunk
    for layers in chunks:
        sparse = [is_moe_layer(m, i) for i in layers]
        first = {kind: layers[sparse.index(kind)] for kind in set(sparse)}
        kinds = {kind: saved_layer_bytes(m, i, layout, t, rc) for kind, i in first.items()}
        saved = [kinds[kind] for kind in sparse]  # every dense (MoE) layer saves the same
        if rc.granularity != "full":
            per_chunk.append((sum(a for a, _ in saved), sum(b for _, b in saved), 0))
            continue
        k = min(rc.num_layers or 1, len(layers))
        if rc.method == "uniform":  # every group of k layers keeps its input only
            groups = -(-len(layers) // k)
            per_chunk.append(
                (
                    groups * hidden_bytes(m, layout, t),
                    0,
                    max(sum(map(sum, saved[j : j + k])) for j in range(0, len(saved), k)),
                )
            )
        else:  # block: the first k layers keep their inputs only; they are re-run after the rest's backward freed
            rest = saved[k:]  # one micro-batch's saved tensors
            recomputed = max((sum(x) for x in saved[:k]), default=0) - sum(map(sum, rest))
            rows = (
                k * hidden_bytes(m, layout, t) + sum(a for a, _ in rest),
                sum(b for _, b in rest),
                max(recomputed, 0),
            )
            per_chunk.append(rows)
    v = len(chunks)
    dense = sum(c[0] for c in per_chunk) * n // v
    routed = sum(c[1] for c in per_chunk) * n // v
    out = {"saved_layer_activations": dense, "stage_boundary": n * hidden_bytes(m, layout, t)}
    if routed:
        out["routed_expert_activations"] = routed
    recomputed = max(c[2] for c in per_chunk)
    if recomputed:
        out["recomputed_layers"] = recomputed
    return tuple(out.items())


def pass_buffers(m: ModelShape, layout: ParallelLayout, stage: int, t: int, forward_only: bool) -> dict[str, int]:
    """Buffers alive through the pass: the SP all-gather buffer, the P2P receive buffers, the RoPE table."""
    last = stage == layout.pp - 1
    recv = (stage > 0) * (1 if forward_only or not last else 2) + (not forward_only and not last and layout.pp > 1)
    out = {"rope_table": 4 * t * m.head_dim}
    if layout.sequence_parallel:
        out["sp_gather_buffer"] = 2 * m.hidden_size * t
    if recv:
        out["p2p_buffers"] = recv * hidden_bytes(m, layout, t)
    return out


def head_terms(
    m: ModelShape, layout: ParallelLayout, t: int, forward_only: bool, entropy: bool, critic: bool
) -> dict[str, int]:
    """The last stage's head on Float16Module's fp32 logits [t, Vp] (verl's ``_lm_head_logits_processor``):
    forward_only without entropy peaks at the upcast (bf16 + fp32 logits); with the entropy the clone and the
    softmax join the fp32 logits; the update keeps the logits (vocab_parallel_cross_entropy's exp_logits, in place)
    and, at the temperature division's backward, their fp32 gradient. The critic's head is [t, 1]."""
    if critic:
        return {"value_head": 4 * t}
    logit = t * -(-m.vocab_size // layout.tp)
    if entropy:
        return {"logits_fp32": 4 * logit, "entropy_clone": 4 * logit, "entropy_softmax": 4 * logit}
    if forward_only:
        return {"logits_bf16": 2 * logit, "logits_fp32": 4 * logit}
    return {"logits_fp32": 4 * logit, "logits_grad_fp32": 4 * logit}


@dataclass(frozen=True)
class StageInputs:
    """What one stage's memory needs beside the model and layout."""

    tokens: int
    """t: the largest micro-batch's tokens on this GPU (padded per sequence, divided by CP)."""
    micro_batches: int
    """Mμ of the pass (sets the in-flight count of the schedule)."""
    recompute: Recompute = field(default_factory=Recompute)
    entropy: bool = False
    """The head computes the entropy (old_log_prob always; the update when entropy_coeff ≠ 0)."""
