"""Every term of the Megatron memory model (``labkit.memory.megatron_memory``), named once: its formula, the config keys
it depends on, what it is (docs/megatron.md renders this table).

Per GPU of pipeline stage r: Φ = the stage's parameters on this rank (dense layers over TP, the embedding V·H/TP on the
first stage, the output layer V·H/TP on the last, experts over ETP·EP), Φe of them routed-expert parameters; t = the
micro-batch's tokens on this GPU (each sequence padded to a multiple of TP·CP·2, or TP, then divided by CP); s = TP with
sequence parallelism, else 1; p = TP; H hidden, q = heads·head_dim, kv = KV groups·head_dim, nh = heads, I = MLP width,
Vp = ⌈V/TP⌉; n = micro-batches (chunk-forwards) in flight at the stage's peak; Lc = the stage's layers.
"""

from __future__ import annotations

from labkit.memory.terms import Term

MG = "actor_rollout_ref.actor.megatron"
OTC = f"{MG}.override_transformer_config"
SIZES = (f"{MG}.tensor_model_parallel_size", f"{MG}.pipeline_model_parallel_size")
RECOMPUTE = (f"{OTC}.recompute_granularity", f"{OTC}.recompute_method", f"{OTC}.recompute_num_layers")
BUDGET = ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
CP = f"{MG}.context_parallel_size"

MEGATRON_TERMS: dict[str, Term] = {
    "bf16_params": Term(
        "2·Φ (dense over TP·PP; embedding/output V·H/TP on the first/last stage; experts over ETP·EP·PP)",
        (*SIZES, f"{MG}.expert_model_parallel_size", f"{MG}.expert_tensor_parallel_size", f"{MG}.param_offload"),
        "the actor's bf16 weights (DDP param buffer)",
    ),
    "fp32_main_grads": Term(
        "4·Φ, unsharded (verl forces grad_reduce_in_fp32)",
        (*SIZES, f"{MG}.param_offload"),
        "the DDP grad buffer the backward accumulates into; freed by param_offload, else resident in every phase",
    ),
    "optimizer_states": Term(
        "12·(Φ − Φe)/(DP·CP) + 12·Φe/EDP with use_distributed_optimizer, else 12·Φ",
        (f"{MG}.use_distributed_optimizer", f"{MG}.optimizer_offload", CP),
        "fp32 main params + Adam exp_avg, exp_avg_sq",
    ),
    "ref_bf16_params": Term(
        "2·Φ (forward_only: no DDP, no grads, no optimizer)",
        ("actor_rollout_ref.ref.megatron.param_offload",),
        "the reference policy's bf16 weights",
    ),
    "critic_bf16_params": Term(
        "2·Φc (value head H×1 instead of the output layer)", ("critic.megatron.param_offload",), "critic weights"
    ),
    "critic_fp32_main_grads": Term("4·Φc", ("critic.megatron.param_offload",), "critic DDP grad buffer"),
    "critic_optimizer_states": Term(
        "12·Φc/(DP·CP) (distributed optimizer)", ("critic.megatron.optimizer_offload",), "critic fp32 main + Adam"
    ),
    "saved_layer_activations": Term(
        "n · Σ_layers [2H·t/s·(4 − 2·[layernorm]) + 8t/s·[no layernorm] + 2t·(q+2kv)/p + 2t·(q+kv)/p·(1 + qk_norm) "
        "+ 2t·q/p + 4t·nh/p·[no core_attn] + 6t·I/p·[dense, no mlp]] (MoE layers: routed_expert_activations); full "
        "uniform keeps 2H·t/s per group of recompute_num_layers instead, full block 2H·t/s for its first k layers",
        (*SIZES, f"{MG}.sequence_parallel", *RECOMPUTE, f"{OTC}.recompute_modules", *BUDGET, CP),
        "what autograd keeps per layer until the backward: norm inputs/outputs, qkv, RoPE'd q/k, flash-attention "
        "output and softmax_lse, the fc1 output and the SwiGLU output",
    ),
    "routed_expert_activations": Term(
        "n · Σ_MoE layers [4t/s·E + R·(2H + 6·Im/ETP) + 6t·Is/p], R = k·t·ETP/s routed token copies",
        (f"{MG}.expert_model_parallel_size", f"{MG}.expert_tensor_parallel_size", f"{OTC}.recompute_modules"),
        "MoE layers: the router's fp32 probabilities, the experts' input after the all-to-all, their fc1 and SwiGLU "
        "outputs (moe_act recompute drops the SwiGLU's), the shared expert's like a dense MLP",
    ),
    "stage_boundary": Term(
        "n · 2H·t/s",
        (f"{MG}.pipeline_model_parallel_size",),
        "each in-flight micro-batch's stage output (kept for its backward; on the last stage the final norm's input)",
    ),
    "recomputed_layers": Term(
        "full uniform: one group's saved activations (recompute_num_layers layers); block: what one re-run layer holds "
        "beyond the un-checkpointed layers its micro-batch has freed (usually 0)",
        RECOMPUTE,
        "the layers the backward re-runs, alive while it walks them",
    ),
    "layer_backward": Term(
        "dense 4t·I/p; MoE 8·R·H (+ 6t·Is/p)",
        SIZES,
        "one layer's backward temporaries at the MLP: the fc1 output's and SwiGLU output's gradients less the SwiGLU "
        "output fc2's backward released; MoE the experts' outputs, their concatenation, the unpermute's gather and "
        "the all-to-all's receive",
    ),
    "layer_forward": Term(
        "dense 6t·I/p + 5·2H·t/s; MoE 10·R·H + 6t·Is/p + 5·2H·t/s",
        SIZES,
        "forward_only: one layer's working set under no_grad: fc1 and SwiGLU outputs (MoE: the permuted copies, the "
        "all-to-all's receive, the experts' input, outputs and their concatenation) and five residual-stream tensors",
    ),
    "embedding_grad": Term(
        "2·Vp·H at the first stage's embedding backward (the other in-flight micro-batches' activations still held)",
        SIZES,
        "the embedding's bf16 weight gradient before the DDP hook adds it into the fp32 main grad",
    ),
    "sp_gather_buffer": Term(
        "2H·t when sequence_parallel (TP > 1)",
        (f"{MG}.sequence_parallel",),
        "megatron-core's global memory buffer the column-parallel linears all-gather their input into",
    ),
    "p2p_buffers": Term(
        "2H·t/s per receive buffer: forward_only 1 on stages > 0; update 1 on the first stage, 2 on the others",
        (f"{MG}.pipeline_model_parallel_size",),
        "the schedule's receive buffers",
    ),
    "rope_table": Term(
        "4·t·head_dim",
        (CP,),
        "the rotary embedding's fp32 cos/sin table for the micro-batch's positions (this CP rank's chunks)",
    ),
    "logits_fp32": Term(
        "4·t·Vp",
        (*SIZES, *BUDGET),
        "the last stage's vocabulary-parallel logits, upcast to fp32 by Float16Module, divided by the temperature in "
        "place; vocab_parallel_cross_entropy works in them in place (its exp_logits)",
    ),
    "logits_bf16": Term(
        "2·t·Vp",
        SIZES,
        "the output layer's bf16 logits at Float16Module's fp32 upcast (ref_log_prob and values' peak), freed after",
    ),
    "entropy_clone": Term(
        "4·t·Vp (old_log_prob; the update when entropy_coeff ≠ 0)",
        ("actor_rollout_ref.actor.entropy_coeff",),
        "logits.clone() verl makes so the entropy and the log-probs can both work in place",
    ),
    "entropy_softmax": Term(
        "4·t·Vp",
        ("actor_rollout_ref.actor.megatron.entropy_from_logits_with_chunking",),
        "_VocabParallelEntropy's softmax (logits − max, exp'd, divided in place), saved for the backward",
    ),
    "logits_grad_fp32": Term(
        "4·t·Vp (update without the entropy; with it the forward's three fp32 copies are the peak)",
        ("actor_rollout_ref.actor.entropy_coeff",),
        "the gradient of the fp32 logits (the in-place temperature division's backward makes a new one)",
    ),
    "value_head": Term(
        "4·t (critic: the [t, 1] values, fp32)",
        ("critic.megatron.tensor_model_parallel_size",),
        "the critic's head output",
    ),
}


def megatron_terms_markdown() -> str:
    """The table of every Megatron term for docs/megatron.md."""
    rows = ["| term | bytes per GPU | what it is | config keys |", "|---|---|---|---|"]
    for name, term in MEGATRON_TERMS.items():
        keys = ", ".join(f"`{k}`" for k in term.keys) or "—"
        rows.append(f"| `{name}` | {term.formula} | {term.meaning} | {keys} |")
    return "\n".join(rows) + "\n"
