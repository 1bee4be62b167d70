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
from typing import Any

from labkit.memory.shapes import ModelShape
from labkit.rules.parallel_layout import ParallelLayout
from labkit.rules.pipeline_layout import layout_error, layout_layers


def moe_of(m: ModelShape) -> Any:
    """The model's sparse MLP shape (``labkit.memory.shapes_parts.MoeShape``), or None when dense."""
    return getattr(m, "moe", None)


def is_moe_layer(m: ModelShape, index: int) -> bool:
    """Layer ``index`` holds the sparse MLP (False for dense models)."""
    f = getattr(m, "is_moe_layer", None)
    return bool(f(index)) if f else False


def stage_layers(m: ModelShape, layout: ParallelLayout, stage: int) -> tuple[tuple[int, ...], ...]:
    """The decoder layers of ``stage``, one tuple per model chunk: virtual stage c·PP + r holds
    L/(PP·V) consecutive layers; with ``num_layers_in_first/last_pipeline_stage`` the first/last stage holds that many
    and the rest split evenly (``megatron/core/transformer/transformer_block.py: get_num_layers_to_build``); a custom
    ``pipeline_model_parallel_layout`` places them as it says (``labkit.rules.pipeline_layout``)."""
    if layout.pipeline_layout is not None:
        error = layout_error(layout.pipeline_layout, layout.pp, layout.vpp, m.num_hidden_layers)
        if error:
            raise ValueError(error)
        return layout_layers(layout.pipeline_layout, layout.pp, stage)
    first, last = layout.first_stage_layers, layout.last_stage_layers
    if first is None and last is None and layout.split_slots:
        return _slotted_layers(
            m.num_hidden_layers, layout.pp, layout.vpp or 1, stage, layout.embedding_slot, layout.split_slots
        )
    if first is None and last is None:
        return _stage_layers(m.num_hidden_layers, layout.pp, layout.vpp or 1, stage)
    return _uneven_layers(m.num_hidden_layers, layout.pp, layout.vpp or 1, stage, first, last)


@lru_cache(maxsize=1024)
def _uneven_layers(total: int, pp: int, v: int, stage: int, first: int | None, last: int | None) -> tuple:
    if v > 1:
        raise ValueError("uneven pipeline stages with virtual pipeline stages are not priced")
    left, stages = total - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
    if left < 0 or (stages > 0 and left % stages) or (stages == 0 and left):
        raise ValueError(
            f"num_layers ({total}) cannot be split as first {first}, last {last} over {pp} pipeline stages"
        )
    counts = [left // stages if stages else 0] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    start = sum(counts[:stage])
    return (tuple(range(start, start + counts[stage])),)


@lru_cache(maxsize=1024)
def _slotted_layers(total: int, pp: int, v: int, stage: int, embedding: bool, slots: int) -> tuple:
    """The even split with the embedding and/or the loss counted as a layer (megatron-core's
    ``get_num_layers_to_build``): (L + slots)/(PP·V) per virtual stage, one fewer where the embedding (first) or the
    loss (last virtual stage) sits; layers are laid out in virtual-stage order."""
    counts = _stage_layers(total + slots, pp, v, 0)  # raises like megatron-core when the split is uneven
    per = len(counts[0])
    sizes = [per] * (pp * v)
    if embedding:
        sizes[0] -= 1
    if slots - embedding:
        sizes[-1] -= 1
    if min(sizes) < 0:
        raise ValueError("Not enough layers in the first or last virtual pipeline stage")
    starts = [sum(sizes[:i]) for i in range(pp * v)]
    return tuple(tuple(range(starts[c * pp + stage], starts[c * pp + stage] + sizes[c * pp + stage])) for c in range(v))


@lru_cache(maxsize=1024)
def _stage_layers(total: int, pp: int, v: int, stage: int) -> tuple[tuple[int, ...], ...]:
    if total % (pp * v):
        raise ValueError(
            f"num_layers ({total}) must be divisible by pipeline_model_parallel_size ({pp}) × virtual stages ({v})"
        )
    per = total // (pp * v)
    return tuple(tuple(range((c * pp + stage) * per, (c * pp + stage + 1) * per)) for c in range(v))


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

    @property
    def per_param(self) -> float:
        return (self.main + self.exp_avg + self.exp_avg_sq) * self.gpu_share


ADAM = OptimizerBytes()


def model_states(
    m: ModelShape, layout: ParallelLayout, stage: int, critic: bool = False, opt: OptimizerBytes | None = None
) -> dict[str, int]:
    """One model's states on a rank of ``stage``: bf16 params (2 B), main grads (fp32 4 B, unsharded), optimizer
    (``OptimizerBytes``: 12 B fp32 by default, over DP·CP for dense, expert DP for experts, with the distributed
    optimizer; unsharded without)."""
    o = opt or ADAM
    phi, experts = stage_params(m, layout, stage, value_head=critic)
    if layout.use_distributed_optimizer:
        dp_cp = max(layout.dp_size * layout.cp, 1)
        shards = (phi - experts) / dp_cp + experts / max(layout.expert_dp_size, 1)
    else:
        shards = phi
    return {"params": 2 * phi, "grads": o.grad * phi, "optimizer": int(o.per_param * shards)}


def residents(m: ModelShape, layout: ParallelLayout, stage: int, phase: str, r: Residency) -> dict[str, int]:
    """Model states on the GPU during ``phase`` (verl's engine: train mode loads params, grads and optimizer, eval
    mode the params only; everything offloaded goes back to CPU on exit)."""
    actor = model_states(m, layout, stage, opt=r.optimizer)
    out: dict[str, int] = {}
    on = phase in ("old_log_prob", "update_actor")
    out["bf16_params"] = actor["params"] if on or not r.param_offload else 0
    out["fp32_main_grads"] = actor["grads"] if phase == "update_actor" or not r.param_offload else 0
    out["optimizer_states"] = actor["optimizer"] if phase == "update_actor" or not r.optimizer_offload else 0
    if r.need_ref:
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
