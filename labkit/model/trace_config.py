"""The Hugging Face config a fake-CUDA memory trace (``labkit.model.memory_trace``) builds its model from: a
``ModelShape``'s fields written back into transformers' config class for its ``model_type`` (dense Qwen2/Qwen3/Llama,
the MoE decoders ``Qwen2MoeForCausalLM`` / ``Qwen3MoeForCausalLM``), optionally with fewer decoder layers (every
layer of these models has the same shape, so a cut model has the same per-layer peak; the trace says so)."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from labkit.memory.shapes import ModelShape
from labkit.memory.shapes_mixers import LinearAttentionShape, MambaShape, MlaShape
from labkit.memory.shapes_moe import MoeShape
from labkit.memory.shapes_vision import VisionShape

VL_TRACEABLE = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
"""VL model_types the tracer builds (``Qwen2VLForConditionalGeneration`` ... ``Qwen3VLMoeForConditionalGeneration``:
the vision tower, its merger and the decoder; ``labkit.model.trace_vision`` feeds the images)."""
TRACEABLE = ("qwen2", "qwen3", "llama", "qwen2_moe", "qwen3_moe", *VL_TRACEABLE)
"""model_types the tracer builds (their HF modules run on fake tensors: the MoE experts through transformers'
default ``grouped_mm`` implementation, whose shapes do not depend on the routing)."""
_PARTS = {
    "moe": MoeShape,
    "mla": MlaShape,
    "linear_attention": LinearAttentionShape,
    "mamba": MambaShape,
    "vision": VisionShape,
}


def shape_from_dict(d: dict[str, Any]) -> ModelShape:
    """A ``ModelShape`` from ``dataclasses.asdict`` of one (the trace child receives shapes as JSON)."""
    known = {f.name for f in fields(ModelShape)}
    kw = {k: v for k, v in d.items() if k in known}
    for key, cls in _PARTS.items():
        if isinstance(kw.get(key), dict):
            part = dict(kw[key])
            kw[key] = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in part.items()})
    if isinstance(kw.get("layer_types"), list):
        kw["layer_types"] = tuple(kw["layer_types"])
    return ModelShape(**kw)


def shape_to_dict(shape: ModelShape) -> dict[str, Any]:
    """The JSON-able form ``shape_from_dict`` reads."""
    return asdict(shape)


def hf_config(shape: ModelShape, layers: int = 0) -> Any:
    """transformers' config for ``shape`` (``layers`` > 0: that many decoder layers); ValueError for a model_type the
    tracer does not build."""
    import transformers as tf

    arch = shape.architecture
    if arch not in TRACEABLE:
        raise ValueError(f"the memory trace builds {', '.join(TRACEABLE)} models, not {arch!r} ({shape.name})")
    n = layers or shape.num_hidden_layers
    common = dict(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=n,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        vocab_size=shape.vocab_size,
        tie_word_embeddings=shape.tie_word_embeddings,
        max_position_embeddings=max(shape.max_position_embeddings, 2**17),
    )
    if arch in VL_TRACEABLE:
        return _vl_config(shape, common)
    if arch == "llama":
        return tf.LlamaConfig(attention_bias=shape.attention_bias, **common)
    if arch == "qwen2":
        return tf.Qwen2Config(**common)
    if arch == "qwen3":
        return tf.Qwen3Config(head_dim=shape.head_dim, **common)
    moe = shape.moe
    assert moe is not None, f"{shape.name}: a {arch} shape without its MoE part"
    sparse = _sparse(moe, n)
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(head_dim=shape.head_dim, **sparse, **common)
    return tf.Qwen2MoeConfig(shared_expert_intermediate_size=moe.shared_expert_intermediate_size, **sparse, **common)


def _sparse(moe: MoeShape, layers: int) -> dict[str, Any]:
    """The MoE keys of a Qwen2/3-MoE (or Qwen3-VL-MoE text) config."""
    return dict(
        num_experts=moe.num_experts,
        num_experts_per_tok=moe.num_experts_per_tok,
        moe_intermediate_size=moe.moe_intermediate_size,
        decoder_sparse_step=moe.decoder_sparse_step,
        mlp_only_layers=[i for i in moe.mlp_only_layers if i < layers],
        norm_topk_prob=True,
        output_router_logits=False,  # the released configs' value: no router logits kept, no aux loss (verl)
    )


def _vl_config(shape: ModelShape, common: dict[str, Any]) -> Any:
    """A Qwen-VL config: the decoder's keys as ``text_config``, the tower's as ``vision_config`` (Qwen2.5-VL's
    window size and full-attention blocks and Qwen3-VL's DeepStack taps at their released defaults; only their
    count shapes memory)."""
    import transformers as tf

    v = shape.vision
    assert v is not None, f"{shape.name}: a VL shape without its vision tower"
    arch, text = shape.architecture, dict(common)
    tie = text.pop("tie_word_embeddings")
    vision: dict[str, Any] = dict(depth=v.depth, num_heads=v.num_heads, patch_size=v.patch_size,
                                  spatial_merge_size=v.spatial_merge_size, temporal_patch_size=v.temporal_patch_size,
                                  in_channels=v.in_channels)  # fmt: skip
    if arch == "qwen2_vl":
        vision.update(
            embed_dim=v.hidden_size, mlp_ratio=v.intermediate_size // v.hidden_size, hidden_size=v.out_hidden_size
        )
        return tf.Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie)
    vision.update(hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, out_hidden_size=v.out_hidden_size)
    if arch == "qwen2_5_vl":
        return tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie)
    step = max(1, v.depth // (v.deepstack_layers + 1))
    vision.update(num_position_embeddings=v.num_position_embeddings,
                  deepstack_visual_indexes=[step * (i + 1) - 1 for i in range(v.deepstack_layers)])  # fmt: skip
    text["head_dim"] = shape.head_dim
    if arch == "qwen3_vl":
        return tf.Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie)
    assert shape.moe is not None, f"{shape.name}: a {arch} shape without its MoE part"
    text.update(_sparse(shape.moe, common["num_hidden_layers"]))
    return tf.Qwen3VLMoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie)
