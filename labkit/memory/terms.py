"""Every term of the memory model, named once: its formula and the config keys it depends on (docs/memory.md).

P = parameters, F = FSDP shard group, T = tokens one GPU feeds through the model in its largest micro-batch (per
Ulysses rank), V = vocabulary, H = hidden size, I = MLP width, L = layers, q = heads·head_dim, kv = KV heads·head_dim,
b = compute-dtype bytes, C = GPU capacity, u = gpu_memory_utilization, tp = rollout tensor parallel size.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        "+ 8H·[b<4]), plus one layer recomputed in backward and its gated MLP's gradients (2·T·I·b, dense)",
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
    "moe_unsort_grads": Term(
        "3·k·T·H·b (MoE)",
        (),
        "the routed backward's first step: the un-sort's expanded, zeroed and scattered gradients",
    ),
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
