"""A Hugging Face ``config.json`` read into ``ModelShape`` fields: the one parser the catalogue
(``data/model_shapes.json`` keeps each model's config.json keys verbatim) and a user's local checkpoint folder share.

It follows the config classes of transformers 5.x (``Qwen2Config`` ... ``GptOssConfig``, ``Qwen3VLConfig``): the same
keys, the same defaults where a config.json omits one, and the same which-layer rules (``decoder_sparse_step``,
``first_k_dense_replace``, ``full_attention_interval``).
"""

from __future__ import annotations

from typing import Any

from labkit.memory.shapes_mixers import V4_COMPRESSED, LinearAttentionShape, MambaShape, MlaShape, V4AttentionShape
from labkit.memory.shapes_moe import MoeShape
from labkit.memory.shapes_vision import VisionShape

QKV_BIAS = {"qwen2", "qwen2_vl", "qwen2_5_vl", "qwen2_moe", "mimo", "glm4", "glm4_moe", "glm4v"}
"""model_types whose q/k/v projections always carry biases (their config has no switch, or defaults it on)."""
QK_NORM = {
    "qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "gemma3_text", "hy_v3",
}  # fmt: skip
"""model_types with per-head q/k RMSNorm."""
FOUR_NORMS = {"gemma2", "gemma3_text", "glm4", "glm4v"}
"""Decoder layers with four RMSNorms (Gemma 2/3: pre/post attention and MLP; GLM-4: post self-attn and post MLP)."""
MLA = {"deepseek_v2", "deepseek_v3"}
HYBRID = {"qwen3_next", "qwen3_5", "qwen3_5_moe"}
TEXT_TYPES = {
    "qwen2", "qwen3", "llama", "mistral", "mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe",
    "deepseek_v2", "deepseek_v3", "gemma2", "gemma3_text", "glm4", "glm4_moe", "gpt_oss", "seed_oss", "mimo",
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "gemma3", "glm4v", "hy_v3", "nemotron_h",
    "deepseek_v4",
}  # fmt: skip
"""The ``model_type`` values this parser reads (VL ones through their ``text_config`` and ``vision_config``)."""


def _text(c: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The decoder's rules (the outer model_type; Gemma 3's ``gemma3_text``) and keys: a VL config's ``text_config``
    over the top level (older Qwen2-VL configs are flat)."""
    outer = str(c.get("model_type", "")).lower()
    text = {k: v for k, v in c.items() if k != "text_config"}
    if isinstance(c.get("text_config"), dict):
        text.update(c["text_config"])
    return ("gemma3_text" if outer == "gemma3" else outer), text


def _moe(t: str, c: dict[str, Any]) -> MoeShape | None:
    experts = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts")
    if not experts:
        return None
    top_k = c.get("num_experts_per_tok") or c.get("experts_per_token")
    if t in ("mixtral", "gpt_oss"):
        return MoeShape(
            int(experts),
            int(top_k),
            int(c["intermediate_size"]),
            router_bias=t == "gpt_oss",
            expert_bias=t == "gpt_oss",
        )
    shared = int(c.get("shared_expert_intermediate_size") or c.get("moe_shared_expert_intermediate_size") or 0)
    if t != "nemotron_h" and (c.get("n_shared_experts") or c.get("num_shared_experts")):  # DeepSeek/GLM; Hy3
        shared = int(c.get("n_shared_experts") or c["num_shared_experts"]) * int(c["moe_intermediate_size"])
    dense = [int(i) for i in c.get("mlp_only_layers") or ()]
    if t == "hy_v3":  # HYV3Config: mlp_layer_types, by default the first layer dense
        kinds = c.get("mlp_layer_types") or ["dense"] + ["sparse"] * (int(c["num_hidden_layers"]) - 1)
        dense = [i for i, kind in enumerate(kinds) if kind == "dense"]
    if t == "nemotron_h":  # only its E blocks are MoE
        dense = [i for i, kind in enumerate(_nemotron_blocks(c)) if kind != "moe"]
        if c.get("moe_latent_size"):
            raise ValueError("a Nemotron-H MoE with a latent projection (moe_latent_size)")
    return MoeShape(
        num_experts=int(experts),
        num_experts_per_tok=int(top_k),
        moe_intermediate_size=int(c["moe_intermediate_size"]),
        shared_expert_intermediate_size=shared,
        shared_expert_gate=t in ("qwen2_moe", "qwen3_next", "qwen3_5_moe") and shared > 0,
        router_score_bias=t in ("deepseek_v3", "glm4_moe", "hy_v3", "nemotron_h", "deepseek_v4"),
        first_k_dense_replace=int(c.get("first_k_dense_replace") or 0),
        decoder_sparse_step=int(c.get("decoder_sparse_step") or c.get("moe_layer_freq") or 1),
        mlp_only_layers=tuple(dense),
        gated=t != "nemotron_h",
        hash_layers=_hash_layers(c) if t == "deepseek_v4" else 0,
    )


NEMOTRON_BLOCKS = {"M": "mamba", "E": "moe", "*": "full_attention", "-": "mlp", "linear_attention": "mamba"}
"""Nemotron-H's block kinds: ``hybrid_override_pattern`` characters, or ``layers_block_type`` names (transformers
calls the Mamba2 blocks ``linear_attention``), in labkit's names."""


def _nemotron_blocks(c: dict[str, Any]) -> list[str]:
    """Nemotron-H's blocks in order (``NemotronHConfig``: ``layers_block_type``, else the pattern string)."""
    kinds = c.get("layers_block_type") or c.get("layer_types") or list(str(c.get("hybrid_override_pattern", "")))
    return [NEMOTRON_BLOCKS.get(str(k), str(k)) for k in kinds]


V4_RATES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
"""DeepSeek-V4's ``compress_ratios`` values and the layer kinds ``DeepseekV4Config`` makes of them."""


def _hash_layers(c: dict[str, Any]) -> int:
    """DeepSeek-V4's hash-routed MoE layers: ``num_hash_layers`` (or ``mlp_layer_types``' ``hash_moe``; 3 by default)."""
    kinds = c.get("mlp_layer_types")
    return kinds.count("hash_moe") if kinds else int(c.get("num_hash_layers", 3))


def _layer_types(t: str, c: dict[str, Any], layers: int) -> tuple[str, ...]:
    """Per-layer token mixers: the config's ``layer_types``, else the rule its transformers config class applies
    (Qwen3-Next/3.5 ``full_attention_interval``; Gemma 2 alternates sliding/full; Gemma 3 ``sliding_window_pattern``
    (5 sliding, 1 full); Mistral with a ``sliding_window`` slides everywhere). All-full reads as ``()``."""
    if t == "nemotron_h":
        return tuple(_nemotron_blocks(c))
    if t == "deepseek_v4" and not c.get("layer_types"):  # the checkpoint's compress_ratios (one more for MTP)
        return tuple(V4_RATES[int(r)] for r in c["compress_ratios"][:layers])
    if c.get("layer_types"):
        types = tuple(str(x) for x in c["layer_types"])[:layers]
    elif t in HYBRID:
        every = int(c.get("full_attention_interval") or 4)
        types = tuple("full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers))
    elif t in ("gemma2", "gemma3_text"):
        every = 2 if t == "gemma2" else int(c.get("sliding_window_pattern") or 6)
        types = tuple("full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers))
    elif t == "mistral" and c.get("sliding_window"):
        types = ("sliding_attention",) * layers
    else:
        types = ()
    return () if set(types) <= {"full_attention"} else types


def _vision(outer: str, v: dict[str, Any] | None, out: int) -> VisionShape | None:
    if not isinstance(v, dict):
        return None
    if outer == "qwen2_vl":
        d = int(v.get("embed_dim") or 1280)
        return VisionShape(
            "qwen2_vl", d, int(v.get("depth", 32)), int(v.get("num_heads", 16)), int(d * float(v.get("mlp_ratio", 4))),
            int(v.get("patch_size", 14)), int(v.get("spatial_merge_size", 2)), int(v.get("hidden_size") or out),
            temporal_patch_size=int(v.get("temporal_patch_size", 2)), in_channels=int(v.get("in_chans", 3)),
        )  # fmt: skip
    if outer in ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"):
        kind = "qwen2_5_vl" if outer == "qwen2_5_vl" else "qwen3_vl"
        return VisionShape(
            kind, int(v["hidden_size"]), int(v["depth"]), int(v["num_heads"]), int(v["intermediate_size"]),
            int(v.get("patch_size", 14)), int(v.get("spatial_merge_size", 2)), int(v.get("out_hidden_size") or out),
            temporal_patch_size=int(v.get("temporal_patch_size", 2)), in_channels=int(v.get("in_channels", 3)),
            num_position_embeddings=int(v.get("num_position_embeddings") or 0) if kind == "qwen3_vl" else 0,
            deepstack_layers=len(v.get("deepstack_visual_indexes") or ()),
        )  # fmt: skip
    if outer == "glm4v":
        p, img = int(v.get("patch_size", 14)), int(v.get("image_size", 336))
        return VisionShape(
            "glm4v", int(v.get("hidden_size", 1536)), int(v.get("depth", 24)), int(v.get("num_heads", 12)),
            int(v.get("intermediate_size", 13696)), p, int(v.get("spatial_merge_size", 2)),
            int(v.get("out_hidden_size") or out), temporal_patch_size=int(v.get("temporal_patch_size", 2)),
            in_channels=int(v.get("in_channels", 3)), num_position_embeddings=(img // p) ** 2,
        )  # fmt: skip
    if outer == "gemma3":
        p, img = int(v.get("patch_size", 14)), int(v.get("image_size", 896))
        return VisionShape(
            "siglip", int(v.get("hidden_size", 1152)), int(v.get("num_hidden_layers", 27)),
            int(v.get("num_attention_heads", 16)), int(v.get("intermediate_size", 4304)), p, 1, out,
            num_position_embeddings=(img // p) ** 2,
        )  # fmt: skip
    return None


def _quantization(c: dict[str, Any]) -> str:
    """The checkpoint's quantization as the config states it (``quant_method`` and ``fmt``, DeepSeek-V4's
    ``expert_dtype``); empty when it has none."""
    q = c.get("quantization_config")
    if not isinstance(q, dict):
        return ""
    text = " ".join(str(q[k]) for k in ("quant_method", "fmt") if q.get(k))
    return text + (f", experts {c['expert_dtype']}" if c.get("expert_dtype") else "")


def shape_fields(config: dict[str, Any]) -> dict[str, Any]:
    """``ModelShape`` keyword arguments (all but name, published figures, source, family) from a config.json dict.
    KeyError names a missing key; ValueError an architecture not in ``TEXT_TYPES``."""
    outer = str(config.get("model_type", "")).lower()
    if outer not in TEXT_TYPES:
        raise ValueError(f"model_type {config.get('model_type')!r}")
    t, c = _text(config)
    heads, hidden = int(c["num_attention_heads"]), int(c["hidden_size"])
    layers = len(_nemotron_blocks(c)) if t == "nemotron_h" else int(c["num_hidden_layers"])
    mla = None
    if t in MLA:
        mla = MlaShape(
            int(c.get("q_lora_rank") or 0), int(c["kv_lora_rank"]), int(c["qk_nope_head_dim"]),
            int(c["qk_rope_head_dim"]), int(c["v_head_dim"]),
        )  # fmt: skip
    linear = None
    if t in HYBRID:
        linear = LinearAttentionShape(
            int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"]), int(c["linear_key_head_dim"]),
            int(c["linear_value_head_dim"]), int(c.get("linear_conv_kernel_dim") or 4),
        )  # fmt: skip
    compressed = None
    if t == "deepseek_v4":
        rates = dict(c.get("compress_rates") or {})
        compressed = V4AttentionShape(
            int(c["q_lora_rank"]), int(c["o_lora_rank"]), int(c["o_groups"]), int(c["index_n_heads"]),
            int(c["index_head_dim"]), *(int(rates.get(kind, default)) for kind, default in zip(V4_COMPRESSED, (4, 128))),
            hc_mult=int(c.get("hc_mult", 4)),
        )  # fmt: skip
    mamba = None
    if t == "nemotron_h":
        mamba = MambaShape(
            int(c["mamba_num_heads"]), int(c["mamba_head_dim"]), int(c["ssm_state_size"]),
            int(c.get("n_groups") or c.get("mamba_n_groups") or 8), int(c.get("conv_kernel") or c.get("mamba_d_conv") or 4),
            conv_bias=bool(c.get("use_conv_bias", c.get("mamba_conv_bias", True))), proj_bias=bool(c.get("use_bias", False)),
        )  # fmt: skip
    if t in QKV_BIAS and (t.startswith("qwen2") or t == "mimo" or "attention_bias" not in c):
        bias = c.get("qkv_bias", True) is not False  # Qwen2 configs have no switch: always biased
    else:
        bias = bool(c.get("attention_bias", False))
    out_bias = bool(c.get("attention_out_bias", False)) or (t in ("llama", "gpt_oss") and bias)
    return dict(
        architecture=t,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads if mla else int(c.get("num_key_value_heads") or heads),
        head_dim=(mla.qk_nope_head_dim + mla.qk_rope_head_dim) if mla else int(c.get("head_dim") or hidden // heads),
        intermediate_size=int(c.get("intermediate_size") or 0),
        vocab_size=int(c["vocab_size"]),
        tie_word_embeddings=bool(
            config.get("tie_word_embeddings", c.get("tie_word_embeddings", t in ("gemma2", "gemma3_text")))
        ),
        attention_bias=bias,
        qk_norm=t in QK_NORM or bool(c.get("use_qk_norm", False)),
        max_position_embeddings=int(c.get("max_position_embeddings") or 0),
        attention_out_bias=out_bias,
        attention_output_gate=t in HYBRID,
        attention_sinks=t == "gpt_oss",
        norms_per_layer=4 if t in FOUR_NORMS else 1 if t == "nemotron_h" else 2,
        mlp_bias=bool(c.get("mlp_bias", False)),
        gated_mlp=t != "nemotron_h",
        layer_types=_layer_types(t, c, layers),
        sliding_window=int(c.get("sliding_window") or 0) if c.get("use_sliding_window", True) else 0,
        moe=_moe(t, c),
        mla=mla,
        linear_attention=linear,
        mamba=mamba,
        compressed_attention=compressed,
        vision=_vision(outer, config.get("vision_config"), hidden),
        mtp_layers=int(c.get("num_nextn_predict_layers") or c.get("mtp_num_hidden_layers") or 0),
        mtp_stores_embedding=t in ("deepseek_v3", "glm4_moe"),
        quantization=_quantization(c),
    )
