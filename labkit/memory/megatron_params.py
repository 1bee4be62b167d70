"""Megatron's parameters and model states per pipeline stage and rank: which layers a stage builds, how megatron-core
shards each layer's weights, and what DDP and the distributed optimizer hold for them (verl's wrapping:
``verl/utils/megatron_utils.py: get_model``, ``grad_reduce_in_fp32=True``; ``megatron/core/distributed/
param_and_grad_buffer.py: _ParamAndGradBuffer``, ``megatron/core/optimizer/distrib_optimizer.py``), with verl's
offload rules (``megatron_utils.py: offload_megatron_model_to_cpu``, ``offload_megatron_optimizer``). Part of
``labkit.memory.megatron_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from labkit.memory.lora import LoraSpec
from labkit.memory.megatron_lora import stage_adapters
from labkit.memory.megatron_stages import is_moe_layer, moe_of, stage_layers
from labkit.memory.shapes import ModelShape
from labkit.rules.parallel_layout import ParallelLayout


def widths(m: ModelShape, tp: int) -> tuple[int, int, int, int, int]:
    """(H, q/TP, kv/TP, I, TP): the residual width, one rank's query and key/value widths, the MLP width, TP."""
    h, d = m.hidden_size, m.head_dim
    return h, m.num_attention_heads * d // tp, m.num_key_value_heads * d // tp or d, m.intermediate_size, tp


APPROXIMATED = {
    "mla": "MLA attention: its parameters are split over TP like q/k/v (megatron-core keeps the down-projections "
    "whole on every TP rank) and its activations are priced as full attention of the config's widths",
    "linear_attention": "gated delta-net layers: their parameters are split over TP and their activations priced as "
    "full attention of the config's widths",
    "compressed_attention": "DeepSeek-V4's compressed attention and hyper-connections: their parameters are split "
    "over TP and their activations priced as full attention of the config's widths with one residual stream",
    "mamba": "Mamba2 blocks (Nemotron-H): their parameters are split over TP and every block's activations priced "
    "as a full decoder layer of the config's widths (an over-estimate)",
    "vision": "the vision tower: its parameters sit on the first pipeline stage, split over TP, and its activations "
    "are not priced",
}
"""What the Megatron memory model approximates for each model feature it does not trace (said in the answer)."""


def approximations(m: ModelShape) -> list[str]:
    """The approximations ``m``'s features need (``APPROXIMATED``), empty for the dense and MoE decoders traced."""
    return [text for feature, text in APPROXIMATED.items() if getattr(m, feature, None) is not None]


def layer_params(m: ModelShape, index: int, layout: ParallelLayout) -> tuple[int, int]:
    """One layer's parameters on this rank as megatron-core shards them: (all, routed experts). Norm weights,
    row-parallel biases and the router are replicated over TP; q/k/v, proj, fc1, fc2 split over TP; routed experts
    over ETP·EP (``megatron/core/transformer/``: ``attention.py``, ``mlp.py``, ``moe/experts.py``)."""
    h, q, kv, i, tp = widths(m, layout.tp)
    hd = m.head_dim
    q_out = 2 * q if getattr(m, "attention_output_gate", False) else q
    attn = h * (q_out + 2 * kv) + q * h + (q_out + 2 * kv) * m.attention_bias + 2 * hd * m.qk_norm
    attn += h * getattr(m, "attention_out_bias", False) + m.num_attention_heads // tp * getattr(
        m, "attention_sinks", False
    )
    special = m.mla is not None or m.compressed_attention is not None
    if special or m.layer_type(index) in ("linear_attention", "mamba") or not m.has_mixer(index):
        attn = -(-m.attention_param_count(index) // tp)  # APPROXIMATED: the mixer's own count over TP
    norms = getattr(m, "norms_per_layer", 2) * h
    moe = moe_of(m)
    if moe is None or not is_moe_layer(m, index):
        if not m.has_mlp(index):  # a Nemotron-H mixer block
            return norms + attn, 0
        bias = (2 * i // tp + h) if getattr(m, "mlp_bias", False) else 0
        return norms + attn + (3 if m.gated_mlp else 2) * h * i // tp + bias, 0
    e, im = moe.num_experts, moe.moe_intermediate_size
    one = moe.projections * h * im // layout.etp + ((2 * im // layout.etp + h) if moe.expert_bias else 0)
    experts = (e // layout.ep) * one
    router = e * h + e * moe.router_bias
    shared = moe.projections * h * moe.shared_expert_intermediate_size // tp + h * moe.shared_expert_gate
    return norms + attn + router + shared + experts, experts


@lru_cache(maxsize=1024)
def stage_params(m: ModelShape, layout: ParallelLayout, stage: int, value_head: bool = False) -> tuple[int, int]:
    """The stage's parameters on one rank: (all, routed experts); embedding V·H/TP on the first stage, the final
    norm and output layer V·H/TP on the last (tied with PP = 1: shared; tied with PP > 1: a copy), or the critic's
    value head H."""
    total = experts = 0
    kinds: dict[tuple[bool, str], tuple[int, int]] = {}  # the layers of one kind have the same parameters
    for chunk in stage_layers(m, layout, stage):
        for index in chunk:
            kind = (is_moe_layer(m, index), m.layer_type(index))
            if kind not in kinds:
                kinds[kind] = layer_params(m, index, layout)
            a, e = kinds[kind]
            total, experts = total + a, experts + e
    vp = -(-m.vocab_size // layout.tp) * m.hidden_size
    if stage == 0:
        total += vp + -(-m.vision_param_count() // layout.tp)  # APPROXIMATED: the vision tower on the first stage
    if stage == layout.pp - 1:  # the final norm (DeepSeek-V4: its hyper-connection head too) and the output layer
        total += m.compressed_attention.head_param_count(m.hidden_size) if m.compressed_attention else 0
        total += m.hidden_size + (
            m.hidden_size if value_head else (0 if m.tie_word_embeddings and layout.pp == 1 else vp)
        )
    return total, experts


def check_groups(m: ModelShape, tp: int) -> None:
    if m.num_key_value_heads % tp or m.num_attention_heads % tp:
        raise ValueError(
            f"tensor_model_parallel_size {tp} must divide the {m.num_attention_heads} attention heads and the "
            f"{m.num_key_value_heads} query groups (megatron-core splits both)"
        )


@dataclass(frozen=True)
class Residency:
    """Which models share the GPU and what is offloaded (``megatron.param_offload`` / ``optimizer_offload``)."""

    param_offload: bool = False
    optimizer_offload: bool = False
    need_ref: bool = True
    ref_param_offload: bool | None = None
    """None: the actor's (verl's ref config follows it)."""
    need_critic: bool = False
    critic_param_offload: bool = False
    critic_optimizer_offload: bool = False
    optimizer: OptimizerBytes = None  # type: ignore[assignment]
    """The actor's optimizer as megatron-core's OptimizerConfig sets it (None: Adam, fp32, all on the GPU)."""
    critic_optimizer: OptimizerBytes = None  # type: ignore[assignment]
    lora: LoraSpec | None = None
    """The actor's LoRA adapters (``labkit.memory.megatron_lora``): the base frozen, the reference the actor."""


@dataclass(frozen=True)
class OptimizerBytes:
    """Bytes a parameter's optimizer holds on the GPU: master weight and Adam moments (``main_params_dtype``,
    ``exp_avg_dtype``, ``exp_avg_sq_dtype`` of the precision-aware optimizer; fp32 each by default), the share
    ``optimizer_cpu_offload`` keeps on the GPU (1 − ``optimizer_offload_fraction``; megatron-core's
    ``HybridDeviceOptimizer`` moves that fraction of the parameters and their states to CPU Adam), and the main
    gradient's bytes (``main_grads_dtype``)."""

    main: int = 4
    exp_avg: int = 4
    exp_avg_sq: int = 4
    gpu_share: float = 1.0
    grad: int = 4
    main_share: float | None = None
    """The share of the main params on the GPU where it is not ``gpu_share`` (``cpu_offloaded``)."""

    @property
    def per_param(self) -> float:
        main_share = self.gpu_share if self.main_share is None else self.main_share
        return self.main * main_share + (self.exp_avg + self.exp_avg_sq) * self.gpu_share


ADAM = OptimizerBytes()


def cpu_offloaded(fraction: float, precision_aware: bool, grad: int = 4) -> OptimizerBytes:
    """``optimizer_cpu_offload``: megatron-core's ``HybridDeviceOptimizer`` (``param_update_in_fp32=True``) moves
    ``fraction`` of the shards' elements to CPU AdamW and keeps fp32 Adam states for the rest, whatever
    ``exp_avg_dtype``/``exp_avg_sq_dtype`` say (its sub-optimizers get no dtype arguments). Traced (megatron-core
    0.16.1's optimizer stepped on fake CUDA, ``labkit.model.trace_megatron_optimizer``): without the precision-aware
    optimizer the ``DistributedOptimizer`` makes the fp32 main shards on the GPU before the hybrid optimizer copies
    the offloaded ones to the CPU, and they stay: 4 + 8·(1 − fraction) bytes a parameter (4 at fraction 1, not 0);
    with it the hybrid optimizer makes the fp32 masters itself, on the GPU only for the kept share: 12·(1 − fraction).
    It offloads whole parameter shards until the fraction is reached, so the GPU keeps at most 1 − fraction (one
    shard less at worst: the embedding's on the first stage of a model cut to a few layers)."""
    keep = 1.0 - fraction
    return OptimizerBytes(gpu_share=keep, grad=grad, main_share=keep if precision_aware else 1.0)


def model_states(
    m: ModelShape,
    layout: ParallelLayout,
    stage: int,
    critic: bool = False,
    opt: OptimizerBytes | None = None,
    lora: LoraSpec | None = None,
) -> dict[str, int]:
    """One model's states on a rank of ``stage``: bf16 params (2 B), main grads (fp32 4 B, unsharded), optimizer
    (``OptimizerBytes``: 12 B fp32 by default, over DP·CP for dense, expert DP for experts, with the distributed
    optimizer; unsharded without). With ``lora`` the base is frozen: DDP's grad buffer and the optimizer hold the
    bf16 adapters only (``labkit.memory.megatron_lora``)."""
    o = opt or ADAM
    phi, experts = stage_params(m, layout, stage, value_head=critic)
    params = 2 * phi
    if lora is not None:
        adapters, adapter_experts = stage_adapters(m, lora, layout, stage)
        params += 2 * adapters
        phi, experts = adapters, adapter_experts
    if layout.use_distributed_optimizer:
        dp_cp = max(layout.dp_size * layout.cp, 1)
        shards = (phi - experts) / dp_cp + experts / max(layout.expert_dp_size, 1)
    else:
        shards = phi
    return {"params": params, "grads": o.grad * phi, "optimizer": int(o.per_param * shards)}


def residents(m: ModelShape, layout: ParallelLayout, stage: int, phase: str, r: Residency) -> dict[str, int]:
    """Model states on the GPU during ``phase`` (verl's engine: train mode loads params, grads and optimizer, eval
    mode the params only; everything offloaded goes back to CPU on exit)."""
    actor = model_states(m, layout, stage, opt=r.optimizer, lora=r.lora)
    out: dict[str, int] = {}
    on = phase in ("old_log_prob", "update_actor")
    out["bf16_params"] = actor["params"] if on or not r.param_offload else 0
    out["fp32_main_grads"] = actor["grads"] if phase == "update_actor" or not r.param_offload else 0
    out["optimizer_states"] = actor["optimizer"] if phase == "update_actor" or not r.optimizer_offload else 0
    if r.need_ref and r.lora is None:  # LoRA: the reference is the actor with its adapters off (ref_in_actor)
        ref_off = r.param_offload if r.ref_param_offload is None else r.ref_param_offload
        out["ref_bf16_params"] = actor["params"] if phase == "ref_log_prob" or not ref_off else 0
    if r.need_critic:
        c = model_states(m, layout, stage, critic=True, opt=r.critic_optimizer)
        on = phase in ("values", "update_critic")
        out["critic_bf16_params"] = c["params"] if on or not r.critic_param_offload else 0
        out["critic_fp32_main_grads"] = c["grads"] if phase == "update_critic" or not r.critic_param_offload else 0
        out["critic_optimizer_states"] = (
            c["optimizer"] if phase == "update_critic" or not r.critic_optimizer_offload else 0
        )
    return out
