"""Per-GPU memory of each phase of one RL step (verl's hybrid engine: actor, rollout, ref and critic share GPUs).

A phase is a set of instants (the layer forward, the log-prob head, the backward, the optimizer step, ...), each a sum
of named terms (``labkit.memory.terms.TERMS``); its peak is the largest instant, and its terms are that instant's.
Resident model states follow verl's offload rules (``fsdp_workers.py`` / the FSDP engine): a model's own phase loads
it, ``*_offload`` moves it to CPU otherwise; a sleeping engine (``free_cache_engine``) frees its share after generate.
"""

from __future__ import annotations

from labkit.memory import head_terms as h
from labkit.memory import term_bytes as t
from labkit.memory.kv_cache import kv_layout
from labkit.memory.lora import (
    lora_backward_extra_bytes,
    lora_forward_extra_bytes,
    lora_saved_layer_bytes,
    vllm_lora_bytes,
)
from labkit.memory.phase_info import model_info, vision_info
from labkit.memory.phase_records import PassShape, Phase
from labkit.memory.settings import MemorySettings
from labkit.memory.shapes import ModelShape
from labkit.memory.vision import (
    image_embeds_bytes,
    vision_backward_bytes,
    vision_forward_bytes,
    vision_patches,
    vision_saved_bytes,
)


def _residents(s: MemorySettings, phase: str) -> dict[str, int]:
    """Model states on the GPU during ``phase``: each model's own phase loads it, offload frees it elsewhere."""
    m, f = s.model, s.fsdp_world
    p = t.param_count(m)
    pc = p - m.lm_head_param_count() + m.hidden_size  # critic: value head H×1 instead of the LM head
    actor_phase = (
        phase in ("old_log_prob", "update_actor")
        or (phase == "generate" and s.actor_in_generate)
        or (phase == "ref_log_prob" and s.lora is not None)  # LoRA: the reference is the actor, adapters off
    )
    on_gpu = not s.offload_policy
    mb, cb = s.master_bytes, s.critic_master_bytes  # a gradient and each Adam state take the parameter's dtype
    adapters = s.lora.params if s.lora is not None else 0
    trained = adapters if s.lora is not None else p  # LoRA: only the adapters have gradients and Adam states
    out = {
        "params": mb * (p + adapters) // f if on_gpu and (actor_phase or not s.param_offload) else 0,
        "optimizer": 2 * mb * trained // f if on_gpu and (phase == "update_actor" or not s.optimizer_offload) else 0,
        "grads": mb * trained // f if on_gpu and phase == "update_actor" else 0,
    }
    if s.need_ref and not s.ref_offloaded and s.lora is None:  # verl's reference lives on the CPU (CPUOffload)
        out["ref_params"] = s.ref_bytes * p // f if phase == "ref_log_prob" or not s.ref_param_offload else 0
    if s.need_critic:
        critic_phase = phase in ("values", "update_critic")
        out["critic_params"] = cb * pc // f if critic_phase or not s.critic_param_offload else 0
        out["critic_optimizer"] = 2 * cb * pc // f if phase == "update_critic" or not s.critic_optimizer_offload else 0
        out["critic_grads"] = cb * pc // f if phase == "update_critic" else 0
    if phase != "generate" and not s.free_cache_engine:
        out["rollout_share"] = int(s.gpu_memory_utilization * s.gpu_bytes)
    return out


ENGINE_NOTES = {
    "vllm": "vLLM: gpu_memory_utilization is its whole share (weights + profiled activations + KV pool)",
    "sglang": "SGLang: gpu_memory_utilization is its mem_fraction_static (weights + KV pool); its activations sit "
    "above the fraction; CUDA-graph buffers are not modelled",
    "hf": "HF generate: priced as vLLM's pool (labkit's HF engine has no pool of its own)",
    "trtllm": "TensorRT-LLM: priced as vLLM's pool (its own memory split is not modelled)",
}
"""What the generate phase assumes of each rollout engine (``rollout.name``), said in the answer."""


def generate(s: MemorySettings) -> Phase:
    """The rollout: residents plus the engine's share u·C = weights + profiling activations + the KV pool."""
    m, b, tp = s.model, s.rollout_bytes, s.rollout_tp
    share = int(s.gpu_memory_utilization * s.gpu_bytes)
    routed = t.routed_param_count(m)  # vLLM splits a MoE's routed experts over TP·DP, the rest over TP
    weights = b * (t.param_count(m) - routed) // tp + b * routed // (tp * s.rollout_dp)
    acts = t.rollout_activation_bytes(m, b, tp, s.max_num_batched_tokens, s.max_num_seqs)
    slots = vllm_lora_bytes(m, s.lora, b, tp) if s.lora is not None and s.rollout_name != "sglang" else 0
    weights_and_slots = weights + slots
    # vLLM profiles its activations inside u·C; SGLang's mem_fraction_static (verl passes u) covers weights + KV,
    # its activations and CUDA graphs take the memory above it (verl/workers/rollout/sglang_rollout)
    kv = share - weights_and_slots - (0 if s.rollout_name == "sglang" else acts)
    if s.vllm_share_of_free:  # vLLM 0.6.3 (verl 0.1/0.2): u × what is free at start-up, before any Adam state
        at_start = _start_up_residents(s)
        free = s.gpu_bytes - s.cuda_context_bytes - at_start - weights_and_slots - acts
        kv = int(s.gpu_memory_utilization * free)
        share = weights_and_slots + acts + max(kv, 0)
    layout = kv_layout(m, b, tp)
    per_token = layout.per_token + layout.window_per_token
    per_sequence = layout.sequence_bytes(s.max_model_len)
    fit = max(kv, 0) // per_sequence
    info = {
        "engine_share_bytes": share,
        "rollout_engine": ENGINE_NOTES.get(s.rollout_name, ENGINE_NOTES["vllm"]),
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_sequence": per_sequence,
        "kv_layers": layout.kinds,
        "sequences_that_fit": fit,
        "sequences_in_flight": min(fit, s.max_num_seqs),
        "engine_error": None,
        **model_info(m),
    }
    if layout.window:
        info["sliding_window"] = layout.window
    if m.quantization:
        info["quantized_weights"] = (
            f"the checkpoint is quantized ({m.quantization}); the engine's weights are priced in the rollout dtype, "
            "an over-estimate when it keeps them quantized"
        )
    if layout.state:
        info["linear_state_bytes_per_sequence"] = layout.state
    if kv <= 0:
        info["engine_error"] = (
            f"no memory for the KV cache: u·C = {share / 2**30:.1f} GiB does not cover the engine's weights and "
            f"activations ({(weights + acts) / 2**30:.1f} GiB); raise gpu_memory_utilization or rollout TP"
        )
    elif fit < 1:
        info["engine_error"] = (
            f"the KV pool ({kv / 2**30:.2f} GiB) holds {kv // max(per_token, 1):,} tokens, fewer than one "
            f"sequence of max_model_len {s.max_model_len:,} needs; raise gpu_memory_utilization or rollout TP"
        )
    engine = {"rollout_weights": weights, "rollout_activations": acts, "kv_cache": max(kv, 0)}
    if slots:
        engine["rollout_lora"] = slots
    return Phase("generate", {"engine": {**_residents(s, "generate"), **engine}}, info)


def _start_up_residents(s: MemorySettings) -> int:
    """What the models hold when vLLM 0.6.3 measures the free memory (verl builds the rollout last): the actor's
    parameters (kept there in 0.1/0.2), the critic's unless offloaded, a resident reference; no Adam state yet."""
    residents = _residents(s, "generate")
    return sum(v for k, v in residents.items() if k in ("params", "critic_params", "ref_params"))


def _gathered(s: MemorySettings) -> int:
    return t.gathered_params(s.model, s.compute_bytes, s.gathered_layers) if s.fsdp else 0


def _layer_grads(s: MemorySettings, critic: bool = False) -> int:
    """One layer's unsharded gradient before FSDP reduce-scatters it (a plain module writes .grad directly); with
    LoRA only the adapters'."""
    if s.lora is not None and not critic:
        return s.compute_bytes * max(s.lora.layer_params) if s.fsdp else 0
    return s.compute_bytes * t.layer_param_count(s.model) if s.fsdp else 0


def _mask(s: MemorySettings, tokens: int) -> dict[str, int]:
    return {"attention_mask": 5 * tokens * tokens} if s.attention == "sdpa" else {}


def forward_pass(s: MemorySettings, name: str, shape: PassShape) -> Phase:
    """A forward-only pass (old_log_prob, ref_log_prob, values) under no_grad: one layer at a time, then the head;
    old_log_prob also computes the entropy (verl computes it there in both profiles)."""
    m, b, tok = s.model, s.compute_bytes, shape.tokens
    base = {**_residents(s, name), "gathered_params": _gathered(s)}
    hidden = tok * m.hidden_size * b
    vocab = 1 if name == "values" else m.vocab_size
    # LoRA: the actor's adapters add to a layer's working set; the reference runs with them off (labkit.memory.lora)
    lora = lora_forward_extra_bytes(m, s.lora, tok, b) if s.lora is not None and name == "old_log_prob" else 0
    instants = {
        "layer_forward": {**base, **_mask(s, tok), "activations": t.forward_layer_bytes(m, tok, b) + lora},
        "log_prob": {**base, "activations": hidden, **h.head(s, shape, vocab)},
    }
    patches = vision_patches(m, shape.rows, s.image_tokens_per_sample)
    if patches:  # the tower runs first, beside the decoder's input embeddings; its outputs wait through the layers
        tower = {**base, "activations": hidden, "vision_activations": vision_forward_bytes(m, patches, b)}
        instants["layer_forward"]["image_embeds"] = image_embeds_bytes(m, shape.rows, s.image_tokens_per_sample, tok, b)
        instants = {"vision_forward": tower, **instants}
    if name == "old_log_prob" or (name == "ref_log_prob" and s.entropy_always):
        logits = {} if s.fused_kernels else {"logits": tok * m.vocab_size * b, **h.temperature_copy(s, tok, vocab)}
        rows = h.head_tokens(s, shape, vocab)
        entropy = {"entropy": h.entropy(s, rows), **h.logsumexp_temp(s, rows)}
        instants["entropy"] = {**base, "activations": hidden, **logits, **entropy}
    return Phase(
        name, instants, {**_info(shape), **model_info(m), **vision_info(s.model, shape.rows, s.image_tokens_per_sample)}
    )


def _info(shape: PassShape) -> dict[str, object]:
    return {"tokens": shape.tokens, "rows": shape.rows, "real_tokens": shape.real_tokens or shape.tokens}


def _mlp_grads(m: ModelShape, tokens: int, b: int) -> int:
    """A dense gated MLP's backward above what the layer saved (traced): the gated product's, the activation's and
    up's T×I gradients wait beside the saved gate and up outputs and the activation, 2·T·I more than the saved set
    (MoE layers: not traced, 0)."""
    return 2 * tokens * m.intermediate_size * b if m.gated_mlp and not m.num_moe_layers else 0


def update_pass(s: MemorySettings, name: str, shape: PassShape) -> Phase:
    """A training micro-batch (update_actor, update_critic): saved activations, the head and its backward, one layer
    recomputed in backward, then the optimizer step with every state on the GPU."""
    m, b, tok = s.model, s.compute_bytes, shape.tokens
    critic = name == "update_critic"
    ckpt = s.critic_gradient_checkpointing if critic else s.gradient_checkpointing
    base = {**_residents(s, name), "gathered_params": _gathered(s)}
    layer_in = tok * m.hidden_size * b
    # LoRA: the frozen base saves less, each adapter its r-wide A output (labkit.memory.lora, traced)
    layer = t.saved_layer_bytes(m, tok, b) if critic or s.lora is None else lora_saved_layer_bytes(m, s.lora, tok, b)
    grads = lora_backward_extra_bytes(m, s.lora, tok, b) if s.lora is not None and not critic else _mlp_grads(m, tok, b)
    if ckpt:
        saved = layer_in if s.activation_offload and not critic else m.num_hidden_layers * layer_in
        recompute = layer + grads
    else:
        saved, recompute = m.num_hidden_layers * layer, grads
    patches = vision_patches(m, shape.rows, s.image_tokens_per_sample)  # verl's critic feeds the images too
    vision = {"vision_activations": vision_saved_bytes(m, patches, b, ckpt)} if patches else {}
    # sdpa: without checkpointing every layer's backward keeps its own copy of the dense mask
    masks = {k: v * (1 if ckpt else m.num_hidden_layers) for k, v in _mask(s, tok).items()}
    vocab = 1 if critic else m.vocab_size
    head, rows = h.head(s, shape, vocab), h.head_tokens(s, shape, vocab)
    entropy = s.update_entropy and not critic
    fwd = {**base, "activations": saved, **head}
    if entropy:
        fwd.update({"entropy": h.entropy(s, rows), **h.logsumexp_temp(s, rows)})
    if s.logprob_kernel == "torch" and vocab > 1 and not s.fused_kernels:  # each row's fp32 log-softmax, saved
        fwd["log_softmax_rows"] = 4 * rows * vocab
    # the head's backward: the LM head's (or the tied embedding's) unsharded weight gradient, made by the head's
    # backward matmul from the logits' gradient, and the final norm's fp32 upcast of the hidden state it saved
    lm_head = {
        "lm_head_grad": 0 if s.lora is not None and not critic else m.vocab_size * m.hidden_size * b,  # LoRA: frozen
        "activations": saved + h.fp32_copy(s) * tok * m.hidden_size,
    }
    if vocab == 1:
        back = {"logits_grad": tok * b}
    elif s.fused_kernels:  # a chunk's recomputed logits and their gradient; the hidden states' gradient
        back = {
            "fused_chunk": h.fused_backward_chunk(s, tok, entropy),
            "hidden_grad": tok * m.hidden_size * b,
            **lm_head,
        }
        # the chunk's LM-head gradient product beside the dvocab_weights accumulator, the chunk's tensors it reads
        weight_grad = {
            **back,
            "fused_chunk": min(tok, h.FUSED_CHUNK) * m.vocab_size * (2 * b + h.fp32_copy(s) + 8),
            "lm_head_grad": 2 * m.vocab_size * m.hidden_size * b,
        }
    elif s.logprob_kernel == "full_log_softmax":
        back = {"log_softmax": tok * vocab * 4, "logits_grad": tok * vocab * (8 + (b if b < 4 else 0))}
    else:  # the cross-entropy's gradient is written into the logits (flash_attn) or stacked from the rows (torch)
        back = {"logits": tok * vocab * b, **lm_head}
        if not s.ce_inplace_backward and s.logprob_kernel == "flash_attn":  # before 0.4: a gradient of its own
            back["logits_grad"] = tok * vocab * b
    extra = (
        {"backward_entropy": {**base, "activations": saved, **h.entropy_backward(s, shape)}}
        if entropy and not s.fused_kernels
        else {}
    )
    if s.fused_kernels and vocab > 1:
        extra["backward_head_weight"] = {**base, "activations": saved, **weight_grad}
    instants = {
        "forward_head": fwd,
        "backward_head": {**base, "activations": saved, **back},  # back may widen the activations
        **extra,
        "backward_layer": {**base, **masks, "activations": saved + recompute, "layer_grads": _layer_grads(s, critic)},
    }
    unsort = t.moe_unsort_grad_bytes(m, tok, b) if critic or s.lora is None else 0  # LoRA: in its grads
    if unsort:  # the routed backward's first step, before any of the layer's gradients exists
        instants["backward_moe_unsort"] = {
            **base,
            **masks,
            "activations": saved + recompute,
            "moe_unsort_grads": unsort,
        }
    p = t.param_count(m) if not critic else t.param_count(m) - m.lm_head_param_count() + m.hidden_size
    step = {k: v for k, v in base.items() if k != "gathered_params"}
    if s.lora is not None and not critic:
        p = s.lora.params
    if not s.offload_policy or critic:
        step["adam_temporaries"] = (s.critic_master_bytes if critic else s.master_bytes) * p // s.fsdp_world
    for key in instants:  # the tower's saved tensors wait through the decoder's forward and backward
        instants[key].update(vision)
    if patches:  # the tower's forward (a checkpointed block's working set on top), and its own backward, last
        top = vision_forward_bytes(m, patches, b) if ckpt else 0
        forward = {**base, "activations": layer_in, "vision_activations": vision["vision_activations"] + top}
        backward = {**base, "vision_activations": vision_backward_bytes(m, patches, b, ckpt)}
        instants = {"vision_forward": forward, **instants, "vision_backward": backward}
    instants["optimizer_step"] = step
    traced = t.largest_param_grad(m, b) if s.fsdp else 0
    info = {**_info(shape), "checkpointing": ckpt, "traced_layer_grad": traced, **model_info(m)}
    return Phase(name, instants, {**info, **vision_info(s.model, shape.rows, s.image_tokens_per_sample)})


def hf_generate(m: ModelShape, rows: int, prompt_length: int, new_tokens: int, b: int) -> Phase:
    """labkit's HF rollout engine (``generate`` with a growing KV cache, no pool): the cache of every row at full
    length, one layer's K/V copy as the cache grows, and the prefill's layer working set or the per-step logits."""
    full = rows * (prompt_length + new_tokens)
    kv = t.kv_bytes_per_token(m, b, 1)
    grow = kv // m.num_hidden_layers * full
    prefill = {"kv_cache": kv * rows * prompt_length, "activations": t.forward_layer_bytes(m, rows * prompt_length, b)}
    decode = {"kv_cache": kv * full, "kv_growth": grow, "logits": rows * m.vocab_size * 4}
    return Phase("generate", {"prefill": prefill, "decode": decode}, {"rows": rows, "tokens": full})
