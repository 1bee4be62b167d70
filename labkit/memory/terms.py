"""Every term of the memory model, named once: its formula and the config keys it depends on (docs/memory.md).

P = parameters, F = FSDP shard group, T = tokens one GPU feeds through the model in its largest micro-batch (per
Ulysses rank), V = vocabulary, H = hidden size, I = MLP width, L = layers, q = heads·head_dim, kv = KV heads·head_dim,
b = compute-dtype bytes, C = GPU capacity, u = gpu_memory_utilization, tp = rollout tensor parallel size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from labkit.memory.shapes import ModelShape


@dataclass(frozen=True)
class Term:
    """One named contribution to a phase's memory."""

    formula: str
    keys: tuple[str, ...]
    meaning: str


A, R, RO, M = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
TERMS: dict[str, Term] = {
    "params": Term("4·P/F", (f"{A}.fsdp_config.param_offload", f"{A}.fsdp_config.fsdp_size"), "the actor's fp32 shard"),
    "grads": Term("4·P/F", (f"{A}.fsdp_config.offload_policy",), "fp32 gradient shard, update only"),
    "optimizer": Term("8·P/F", (f"{A}.fsdp_config.optimizer_offload",), "Adam exp_avg + exp_avg_sq, fp32 shards"),
    "ref_params": Term("4·P/F", (f"{R}.fsdp_config.param_offload",), "the reference policy's fp32 shard"),
    "critic_params": Term("4·Pc/F", ("critic.model.fsdp_config.param_offload",), "critic shard (value head)"),
    "critic_grads": Term("4·Pc/F", (), "critic gradient shard, update_critic only"),
    "critic_optimizer": Term("8·Pc/F", ("critic.model.fsdp_config.optimizer_offload",), "critic Adam states"),
    "rollout_share": Term(
        "u·C (0 when the engine sleeps)",
        (f"{RO}.gpu_memory_utilization", f"{RO}.free_cache_engine"),
        "the engine's claimed memory, kept through training when it does not sleep",
    ),
    "rollout_weights": Term(
        "b·(P − P_routed)/tp + b·P_routed/(tp·dp)",
        (f"{RO}.tensor_model_parallel_size", f"{RO}.data_parallel_size"),
        "the engine's bf16 weight shard (a MoE's routed experts split over TP·DP, the rest over TP)",
    ),
    "rollout_activations": Term(
        "max_num_batched_tokens·b·(2H + (q + 2kv + 2I)/tp) + max_num_seqs·V·4",
        (f"{RO}.max_num_batched_tokens", f"{RO}.max_num_seqs"),
        "the engine's profiling forward and sampler logits, reserved out of its share",
    ),
    "kv_cache": Term(
        "u·C − rollout_weights − rollout_activations",
        (f"{RO}.gpu_memory_utilization",),
        "the KV pool; per token and layer 2·⌈kv/tp⌉·head_dim·b (full attention; sliding layers for at most the "
        "window), (kv_lora_rank + qk_rope_head_dim)·b (MLA); linear-attention and Mamba2 layers a fixed state per "
        "sequence (labkit.memory.kv_cache); max_model_len tokens per sequence",
    ),
    "gathered_params": Term(
        "b·(V·H·(2 − tied) + H + n·P_layer), n = 2 on a GPU, 1 on a CPU",
        (f"{A}.fsdp_config.fsdp_size",),
        "FSDP's unsharded root (embedding, norm, LM head) and n decoder layers (running + prefetched on a GPU)",
    ),
    "activations": Term(
        "forward: T·b·(3H + max(2q + 2kv, 3I)); update: L·T·H·b with checkpointing, else L·T·(b·(4H+2q+2kv+4I) "
        "+ 8H·[b<4]), plus one layer recomputed in backward",
        (
            f"{M}.enable_gradient_checkpointing",
            f"{M}.enable_activation_offload",
            f"{A}.ppo_micro_batch_size_per_gpu",
            f"{A}.ppo_max_token_len_per_gpu",
            f"{A}.ulysses_sequence_parallel_size",
        ),
        "hidden states of the micro-batch",
    ),
    "logits": Term(
        "T·V·b",
        (
            f"{RO}.log_prob_micro_batch_size_per_gpu",
            f"{RO}.log_prob_max_token_len_per_gpu",
            f"{M}.use_remove_padding",
            f"{M}.use_fused_kernels",
        ),
        "a row of logits for every token fed (prompt and padding included on the padded path)",
    ),
    "unpadded_logits": Term(
        "use_remove_padding=false: legacy Th·V·b, Th = rows·response_length (flash_attn head, rows > 1); engine "
        "T_real·V·b",
        (f"{M}.use_remove_padding", f"{RO}.response_length"),
        "the padded path's copy of the logits the log-probs read: legacy flattens the response slice, the engine "
        "concatenates the real tokens' rows",
    ),
    "log_softmax": Term(
        "T·V·(4·[b<4] + 4) for labkit's CPU head (a full log-softmax); 0 with verl's logprobs_from_logits",
        (f"{M}.use_fused_kernels",),
        "the fp32 upcast and the fp32 log-softmax of a naive head",
    ),
    "log_softmax_rows": Term(
        "4·T·V under grad without flash_attn (--head torch)",
        (f"{M}.use_fused_kernels",),
        "verl's torch fallback head (logprobs_from_logits_v2): each token row's fp32 log-softmax, saved for backward",
    ),
    "temperature_copy": Term(
        "T·V·b when rollout.temperature ≠ 1 (engine; legacy divides in place)",
        (f"{RO}.temperature",),
        "the logits divided by the temperature into a copy while the model's output still holds them",
    ),
    "fused_chunk": Term(
        "forward min(T, 512)·V·(4·[b<4] + 8); backward min(T, 512)·V·(b + 4·[b<4] + 18, or 20 with the entropy), "
        "at the LM-head gradient's product min(T, 512)·V·(2b + 4·[b<4] + 8)",
        (f"{M}.use_fused_kernels",),
        "one 512-token chunk of verl's fused log-prob and entropy (FusedLinearForPPO): recomputed logits, fp32 "
        "softmax, products",
    ),
    "hidden_grad": Term(
        "T·H·b (use_fused_kernels)", (f"{M}.use_fused_kernels",), "the fused head's gradient of the hidden states"
    ),
    "entropy": Term(
        "compiled (default) 16·T; eager (use_torch_compile=false) or checkpointed 8·T·V under bf16 autocast (the "
        "softmax and logsumexp's fp32 copy of the logits; + logsumexp_temp); chunked "
        "min(T, chunk)·V·(4·[b<4] + 8); fused 0",
        (
            f"{A}.entropy_from_logits_with_chunking",
            f"{A}.entropy_from_logits_chunk_size",
            f"{A}.entropy_checkpointing",
            f"{A}.entropy_coeff",
            f"{A}.use_torch_compile",
        ),
        "the entropy's forward tensors beyond the logits (old_log_prob always, the update when entropy_coeff ≠ 0)",
    ),
    "logsumexp_temp": Term(
        "4·T·V (eager or checkpointed entropy under bf16 autocast)",
        (f"{A}.use_torch_compile", f"{A}.entropy_checkpointing"),
        "logsumexp's (x − max).exp_() temporary (ATen's composite, ReduceOps.cpp: logsumexp_out_impl), alive with "
        "the fp32 softmax and the fp32 copy of the logits autocast made for logsumexp: 14 bytes a logit in all",
    ),
    "entropy_saved": Term(
        "8·T·V (eager, checkpointed's recompute, chunked: every chunk)",
        (f"{A}.use_torch_compile", f"{A}.entropy_checkpointing"),
        "the update's entropy backward: the fp32 copy of the logits and the fp32 softmax it saved",
    ),
    "entropy_backward": Term(
        "16·T·V (eager, checkpointed); 16·min(T, chunk)·V (chunked)",
        (f"{A}.entropy_from_logits_with_chunking", f"{A}.entropy_from_logits_chunk_size"),
        "fp32 temporaries of the softmax and logsumexp backward: a product, a difference, an exp, a product",
    ),
    "logits_grad": Term(
        "T·V·b (entropy's gradient; compiled: 2·T·V·b with the sum); CPU head T·V·(4 + 4 + b·[b<4]); value head T·b",
        (f"{A}.entropy_coeff",),
        "the backward of the log-prob head",
    ),
    "lm_head_grad": Term(
        "V·H·b in the update's head backward; 2·V·H·b with use_fused_kernels (the accumulator and a chunk's product)",
        (f"{A}.ppo_micro_batch_size_per_gpu",),
        "the LM head's (tied: the embedding's) unsharded weight gradient before FSDP reduce-scatters it",
    ),
    "vision_activations": Term(
        "VL, bytes per patch: no grad one block's working set (~36-49·d); update (depth+1)·b·d with checkpointing, "
        "else depth·(2 norms + 6·b·d + MLP) (~32-50·d a block); mergers, pixels and cos/sin either way; "
        "P = rows · image_tokens_per_sample · merge²",
        (f"{M}.enable_gradient_checkpointing",),
        "the vision tower's activations for the image tokens a sample is assumed to hold (labkit.memory.vision)",
    ),
    "image_embeds": Term(
        "VL: 2·(1 + DeepStack mergers)·I·out·b + P·d·b (+ T·H·b with DeepStack), I = rows · image_tokens_per_sample",
        (f"{M}.enable_gradient_checkpointing",),
        "the merger's image embeddings and their concatenation (Qwen3-VL: the DeepStack features too and a copy of "
        "the hidden states), and the tower's last hidden state, held through the decoder's forward",
    ),
    "attention_mask": Term(
        "5·T² (sdpa on a packed row; 0 with flash attention)",
        (f"{M}.use_remove_padding",),
        "the dense block-diagonal mask sdpa needs for packed sequences: bool and float copies",
    ),
    "layer_grads": Term("b·P_layer (FSDP only)", (), "one unsharded layer's gradient before reduce-scatter"),
    "adam_temporaries": Term("4·P/F", (), "torch AdamW's per-step temporary (sqrt of exp_avg_sq)"),
    "kv_growth": Term("2·kv·b per token of one layer", (), "HF generate only: the copy as one layer's cache grows"),
    "cuda_context": Term(
        "512 MiB (data/gpus.json headroom.cuda_context_mib)",
        (),
        "the CUDA context and kernel images of the process (lazy loading); outside torch's allocator, no trace sees it",
    ),
    "cublas_workspace": Term(
        "32 MiB on Hopper and newer, 8.125 MiB before (torch's CUBLAS_WORKSPACE_CONFIG default)",
        (),
        "cuBLAS's workspace, allocated through torch's caching allocator at the first matmul",
    ),
    "nccl_buffers": Term(
        "communicators · 2 · NCCL_BUFFSIZE (4 MiB) · 32 channels; communicators = FSDP (W > 1) + SP + rollout TP",
        ("trainer.n_gpus_per_node", f"{A}.ulysses_sequence_parallel_size", f"{RO}.tensor_model_parallel_size"),
        "NCCL's send/receive buffers per communicator, outside torch's allocator",
    ),
    "allocator_reserve": Term(
        "5% of the instant's allocated training bytes (an assumption; data/gpus.json headroom)",
        (),
        "the caching allocator's reserved-but-unallocated memory (fragmentation)",
    ),
}


def terms_markdown() -> str:
    """The table of every term for docs/memory.md (a test keeps the page in step with this)."""
    rows = ["| term | bytes per GPU | what it is | config keys |", "|---|---|---|---|"]
    for name, term in TERMS.items():
        keys = ", ".join(f"`{k}`" for k in term.keys) or "—"
        rows.append(f"| `{name}` | {term.formula} | {term.meaning} | {keys} |")
    return "\n".join(rows) + "\n"


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
