"""The terms' byte formulas that depend on the model's shapes (``labkit.memory.terms.TERMS`` names them): FSDP's
gathered parameters, one decoder layer's working set and saved activations (a MoE block's routed copies included),
the largest parameter gradient, the KV bytes per token and the rollout engine's profiling forward.

Symbols as in ``labkit.memory.terms``: T tokens, b compute-dtype bytes, H hidden, q/kv head widths, I MLP width.
"""

from __future__ import annotations

from functools import cache

from labkit.memory.shapes import ModelShape


@cache
def param_count(m: ModelShape) -> int:
    """``m.param_count()``, once per shape (the fixes search prices the same model hundreds of times)."""
    return m.param_count()


@cache
def routed_param_count(m: ModelShape) -> int:
    """Every routed expert of every MoE layer (0 for a dense model): what vLLM splits over TP·DP."""
    return m.num_moe_layers * m.moe.num_experts * m.expert_param_count() if m.moe is not None else 0


@cache
def layer_param_count(m: ModelShape) -> int:
    """``m.layer_param_count()`` (the largest layer, what FSDP gathers at once), once per shape."""
    return m.layer_param_count()


@cache
def _has_dense_mlp(m: ModelShape) -> bool:
    """Some decoder layer keeps the dense MLP (every layer of a dense model; DeepSeek's first_k_dense_replace)."""
    return m.num_moe_layers < m.num_hidden_layers


def root_params(m: ModelShape) -> int:
    """FSDP2's root unit: the embedding, the final norm and the LM head (absent when tied)."""
    return m.embedding_param_count() + m.lm_head_param_count() + m.hidden_size


def gathered_params(m: ModelShape, b: int, layers: int = 2) -> int:
    """FSDP's unsharded root and ``layers`` decoder layers in the compute dtype (FSDP2 gathers even on one GPU)."""
    return b * (root_params(m) + layers * layer_param_count(m))


def _widths(m: ModelShape) -> tuple[int, int, int, int]:
    return m.hidden_size, m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim, m.intermediate_size


def moe_forward_bytes(m: ModelShape, tokens: int, b: int) -> int:
    """One MoE block's working set without grad, transformers' default experts (``integrations/moe.py:
    grouped_mm_experts_forward``): each token copied to its top-k experts (``hidden[perm // k]``), the experts'
    output, its weighted copy and that copy put back in token order, k·T rows of H each (traced), the hidden state
    reshaped, and the routing's int64 indices (top-k, sort, permutation: 8 bytes each per routed copy)."""
    if m.moe is None:
        return 0
    h, k = m.hidden_size, m.moe.num_experts_per_tok
    shared = moe_shared_bytes(m, tokens, b, saved=False)  # runs first (Qwen2MoeSparseMoeBlock); its output waits
    routed = tokens * (4 * k * h * b + h * b + 64 * k) + (tokens * h * b if shared else 0)
    return max(routed, shared)


def moe_saved_bytes(m: ModelShape, tokens: int, b: int) -> int:
    """What autograd keeps of one MoE block: the router's logits (b) and fp32 softmax (4) over E experts; per routed
    copy (k·T) its gathered input (H), the gate/up output (2·I_e), the activation and the gated product (I_e each)
    and the expert output the routing weight multiplies (H); the int64 indices the index backward needs; the shared
    expert as a dense MLP of its width."""
    if m.moe is None:
        return 0
    h, e, k, i = m.hidden_size, m.moe.num_experts, m.moe.num_experts_per_tok, m.moe.moe_intermediate_size
    routed = k * b * (2 * h + (4 if m.moe.gated else 2) * i) + 24 * k  # Nemotron-H: up and its activation
    return tokens * (e * (b + 4) + routed) + moe_shared_bytes(m, tokens, b, saved=True)


def moe_unsort_grad_bytes(m: ModelShape, tokens: int, b: int) -> int:
    """The backward of a MoE block's un-sort (``weighted_out[inv_perm]``, then the sum over the k copies): the
    summed gradient expanded to the k·T copies and made contiguous, the zeros the index backward fills and the
    gradient it puts there, three [k·T, H] tensors beside the block's saved set (traced; 0 without MoE)."""
    if m.moe is None:
        return 0
    return 3 * tokens * m.moe.num_experts_per_tok * m.hidden_size * b


def moe_shared_bytes(m: ModelShape, tokens: int, b: int, saved: bool) -> int:
    """The always-on shared expert (Qwen2-MoE, DeepSeek, Qwen3-Next), a gated MLP of the shared width: without grad
    its working set (gate, up and their product, then its output); saved: gate, up, activation and product."""
    if m.moe is None or not m.moe.shared_expert_intermediate_size:
        return 0
    widths = (4 if saved else 3) if m.moe.gated else 2  # gate, up (act, product); Nemotron-H: up and its activation
    return tokens * b * (widths * m.moe.shared_expert_intermediate_size + m.hidden_size)


def _qk_norm_saved(m: ModelShape, tokens: int, b: int) -> int:
    """Qwen3's per-head q/k RMSNorm under autograd: the fp32 upcast of q and k and their normed copies (traced)."""
    _, q, kv, _ = _widths(m)
    return tokens * (4 + b) * (q + kv) if m.qk_norm and b < 4 else 0


def forward_layer_bytes(m: ModelShape, tokens: int, b: int) -> int:
    """One decoder layer's working set without grad: the residual and its norm, then attention or the MLP (the
    dense MLP, or a MoE block's routed copies: ``moe_forward_bytes``)."""
    h, q, kv, i = _widths(m)
    dense = tokens * b * max(2 * q + 2 * kv, 3 * i if _has_dense_mlp(m) else 0)
    return max(tokens * b * 3 * h + dense, tokens * b * 3 * h + moe_forward_bytes(m, tokens, b))


def saved_layer_bytes(m: ModelShape, tokens: int, b: int) -> int:
    """What autograd keeps of the largest layer: norm inputs and outputs, q/k/v/attention output (and Qwen3's q/k
    norms), then gate/up/act/product of the dense MLP or a MoE block's (``moe_saved_bytes``); RMSNorm upcasts its
    input to fp32 (8H more) when the compute dtype is narrower."""
    h, q, kv, i = _widths(m)
    attention = tokens * (b * (4 * h + 2 * q + 2 * kv) + (8 * h if b < 4 else 0)) + _qk_norm_saved(m, tokens, b)
    dense = tokens * b * 4 * i if _has_dense_mlp(m) else 0
    return attention + max(dense, moe_saved_bytes(m, tokens, b))


def largest_param_grad(m: ModelShape, b: int) -> int:
    """The largest single parameter gradient of a decoder layer: what a backward that frees each gradient as it
    is made holds of ``layer_grads`` (a fake trace; FSDP keeps the whole layer's until it reduce-scatters). MoE:
    the experts' stacked gate/up weight, E·2·I_e·H (transformers keeps the experts as 3-D parameters)."""
    h, q, kv, i = _widths(m)
    dense = h * i if _has_dense_mlp(m) else 0
    moe = m.moe.num_experts * 2 * m.moe.moe_intermediate_size * h if m.moe is not None else 0
    return b * max(dense, moe, h * q)


def kv_bytes_per_token(m: ModelShape, b: int, tp: int) -> int:
    """K and V of every layer for one token on one TP rank (KV heads split over tp, replicated when fewer)."""
    heads = max(1, -(-m.num_key_value_heads // tp)) if m.num_key_value_heads >= tp else 1
    return 2 * m.num_hidden_layers * heads * m.head_dim * b


def rollout_activation_bytes(m: ModelShape, b: int, tp: int, batched_tokens: int, num_seqs: int) -> int:
    """The engine's profiling forward over max_num_batched_tokens and its fp32 sampler logits for max_num_seqs."""
    h, q, kv, i = _widths(m)
    return batched_tokens * b * (2 * h + (q + 2 * kv + 2 * i) // tp) + num_seqs * m.vocab_size * 4
