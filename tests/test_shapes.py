"""labkit.memory.shapes: real model shapes and GPU capacities, checked against published and exact parameter counts."""

from __future__ import annotations

import json
import math
import re

import pytest

from labkit.memory.data_tables import DATA
from labkit.memory.gpus import gpu, gpu_names
from labkit.memory.model_catalogue import ARCHITECTURES, model_names, model_shape

MODELS = json.loads((DATA / "model_shapes.json").read_text())["models"]
LEGACY = [n for n in MODELS if "config" not in MODELS[n]]
"""The first 18 entries: dense Qwen/Llama with flat fields and an exact independent count."""
TIED = {"tiny-qwen2", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-3B", "Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B"}
REQUIRED = {
    *(f"Qwen2.5-{s}" for s in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B")),
    *(f"Qwen3-{s}" for s in ("0.6B", "1.7B", "4B", "8B", "14B", "32B")),
    "Llama-3.1-8B",
    "Llama-3.1-70B",
    "DeepSeek-R1-Distill-Qwen-1.5B",
    "DeepSeek-R1-Distill-Qwen-7B",
    "tiny-qwen2",
}


def test_every_required_model_is_present():
    assert REQUIRED <= set(model_names())


@pytest.mark.parametrize("name", list(MODELS))
def test_param_count_matches_published_within_one_percent(name):
    shape, how = model_shape(name), MODELS[name].get("published_params_match", "within_1pct")
    if how == "label_floor":  # the published figure is the count truncated to the label's digits (Qwen3.5 "27B")
        assert (
            _floor_to_label(shape.param_count(), MODELS[name]["published_params_label"])
            == (MODELS[name]["published_params_label"])
        )
        return
    rel = abs(shape.param_count() - shape.published_params) / shape.published_params
    assert rel <= (0.10 if how == "nameplate" else 0.01), (name, rel)


@pytest.mark.parametrize("name", [n for n in MODELS if "exact_params" in MODELS[n]])
def test_param_count_is_exactly_the_independent_count(name):
    assert model_shape(name).param_count() == MODELS[name]["exact_params"]
    if "exact_active_params" in MODELS[name]:
        assert model_shape(name).active_param_count() == MODELS[name]["exact_active_params"]


@pytest.mark.parametrize("name", [n for n in MODELS if "published_non_embedding_params" in MODELS[n]])
def test_non_embedding_count_matches_the_qwen_cards(name):
    s, published = model_shape(name), MODELS[name]["published_non_embedding_params"]
    non_embedding = s.param_count() - s.embedding_param_count() - s.lm_head_param_count()
    assert abs(non_embedding - published) / published <= 0.01


def test_tiny_model_equals_its_safetensors_element_count():
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(DATA / "tiny-qwen2" / "model.safetensors"), "np") as f:
        total = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    tiny = model_shape("tiny-qwen2")
    assert tiny.param_count() == total == tiny.published_params


def test_tiny_model_matches_its_config_json():
    config = json.loads((DATA / "tiny-qwen2" / "config.json").read_text())
    tiny = model_shape("tiny-qwen2")
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "tie_word_embeddings",
        "max_position_embeddings",
    ):
        assert getattr(tiny, key) == config[key], key


@pytest.mark.parametrize("name", LEGACY)
def test_shape_consistency(name):
    s = model_shape(name)
    assert s.architecture in ARCHITECTURES
    assert s.num_attention_heads % s.num_key_value_heads == 0
    if s.architecture == "qwen3":
        assert s.head_dim == 128 and s.qk_norm and not s.attention_bias
    else:
        assert s.num_attention_heads * s.head_dim == s.hidden_size and not s.qk_norm
        assert s.attention_bias == (s.architecture == "qwen2")
    assert s.tie_word_embeddings == (name in TIED)
    assert s.param_count() == (
        s.embedding_param_count()
        + s.lm_head_param_count()
        + s.num_hidden_layers * s.layer_param_count()
        + s.hidden_size
    )


def test_layer_count_by_hand_qwen2_5_7b():
    s = model_shape("Qwen2.5-7B")
    attention = 3584 * 3584 * 2 + 3584 * 512 * 2 + 3584 + 512 * 2
    assert s.layer_param_count() == attention + 3 * 3584 * 18944 + 2 * 3584
    assert s.embedding_param_count() == s.lm_head_param_count() == 152064 * 3584


def test_qwen3_norms_and_tied_head():
    s = model_shape("Qwen3-0.6B")
    assert s.lm_head_param_count() == 0
    assert s.layer_param_count() == 1024 * 2048 * 2 + 1024 * 1024 * 2 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024


def test_lookups_are_case_insensitive_and_accept_repo_ids():
    assert model_shape("qwen2.5-7b") == model_shape("QWEN2.5-7B") == model_shape(" Qwen2.5-7B ")
    assert model_shape("Qwen/Qwen2.5-7B-Instruct").name == "Qwen2.5-7B"
    assert model_shape("qwen2.5-7b-instruct").name == "Qwen2.5-7B"
    assert gpu("h200").name == gpu("H200").name == "H200"


def test_unknown_names_raise_keyerror_listing_known_ones():
    with pytest.raises(KeyError) as err:
        model_shape("Qwen9-1T")
    assert "Qwen9-1T" in str(err.value) and "Qwen2.5-7B" in str(err.value) and "Llama-3.1-70B" in str(err.value)
    with pytest.raises(KeyError) as err:
        gpu("TPU-v5")
    assert "H100-80GB" in str(err.value) and "B200" in str(err.value)


def test_every_gpu_has_positive_memory():
    assert {"H100-80GB", "H200", "A100-40GB", "A100-80GB", "L40S", "B200", "RTX-4090", "A10G"} <= set(gpu_names())
    for name in gpu_names():
        g = gpu(name)
        assert g.memory_bytes > 0 and g.memory_unit in ("GiB", "GB")
        number = float(re.match(r"[0-9.]+", g.memory_label).group())
        assert g.memory_bytes == round(number * (2**30 if g.memory_unit == "GiB" else 10**9))
        assert g.bf16_tflops is None or g.bf16_tflops > 0


def test_gpu_reported_totals_sit_just_below_nominal():
    """nvidia-smi totals confirm the GiB reading: below the nominal bytes, above the decimal reading, and within 2%
    of nominal for HBM (GDDR with ECC on, the L40S, keeps about 6% for the ECC bits)."""
    for name, entry in json.loads((DATA / "gpus.json").read_text())["gpus"].items():
        if entry.get("nvidia_smi_total_mib"):
            reported = entry["nvidia_smi_total_mib"] * 2**20
            nominal, number = gpu(name).memory_bytes, nominal_number(gpu(name).memory_label)
            assert number * 10**9 < reported <= nominal, name
            floor = 0.93 if "ECC" in entry["memory_label"] else 0.98
            assert floor * nominal <= reported, name


def nominal_number(label):
    return float(re.match(r"[0-9.]+", label).group())


# ---- the catalogue beyond dense Qwen/Llama: MoE, MLA, hybrid attention, vision towers ---------------------------------

MOE = [n for n in MODELS if "published_active_params" in MODELS[n]]


def _floor_to_label(count: int, label: str, rounding=math.floor) -> str:
    """``count`` truncated (or rounded) to the digits of ``label`` (``37.55e9``, ``"37B"`` -> ``"37B"``)."""
    number = re.match(r"[0-9.]+", label).group()
    decimals = len(number.split(".")[1]) if "." in number else 0
    unit = {"B": 1e9, "M": 1e6}[label[len(number)]]
    value = rounding(count / unit * 10**decimals) / 10**decimals
    return f"{value:.{decimals}f}{label[len(number)]}"


@pytest.mark.parametrize("name", MOE)
def test_active_params_match_the_published_figure(name):
    e, s = MODELS[name], model_shape(name)
    count = s.active_param_count()
    if e["published_active_convention"] == "without_input_embedding":
        count -= s.embedding_param_count()
    published, how = e["published_active_params"], e["published_active_match"]
    if how in ("label_floor", "label_round"):  # the label is the count truncated (or rounded) to its digits
        rounding = math.floor if how == "label_floor" else round
        label = e["published_active_params_label"]
        assert _floor_to_label(count, label, rounding) == label, count
    else:
        assert abs(count - published) / published <= (0.10 if how == "nameplate" else 0.01), (name, count)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_entry_records_its_source_and_published_figures(name):
    e = MODELS[name]
    assert "/" in e["source"] or e["source"].startswith("data/")
    assert e["published_params"] > 0 and e["published_params_label"] and e["published_params_source"]
    assert model_shape(name).is_moe == ("published_active_params" in e)


def _hf_count(config: dict) -> int:
    """Parameters (+ DeepSeek's e_score_correction_bias buffer, a checkpoint tensor) of the transformers model the
    config builds, on the meta device (no memory)."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    c = dict(config)
    cfg = tf.AutoConfig.for_model(c.pop("model_type"), **c)
    with torch.device("meta"):
        try:
            model = tf.AutoModelForImageTextToText.from_config(cfg)
        except ValueError:
            model = tf.AutoModelForCausalLM.from_config(cfg)
    extra = sum(b.numel() for k, b in model.named_buffers() if k.endswith("e_score_correction_bias"))
    return sum(p.numel() for p in model.parameters()) + extra


def _shrunk(config: dict) -> dict:
    """The same architecture with 4 layers (the per-layer rules unchanged) so the meta build stays fast."""
    c = json.loads(json.dumps(config))
    text = c.get("text_config", c)
    text["num_hidden_layers"] = c["num_hidden_layers"] = 4 if "text_config" not in c else c.get("num_hidden_layers", 4)
    if "layer_types" in text:
        text["layer_types"] = text["layer_types"][:4]
    if isinstance(c.get("vision_config"), dict):
        c["vision_config"]["depth"] = min(c["vision_config"].get("depth", 4), 4)
        c["vision_config"]["deepstack_visual_indexes"] = c["vision_config"].get("deepstack_visual_indexes", [])[:1]
    return c


ORACLE = [n for n in MODELS if "config" in MODELS[n] and MODELS[n]["config"]["model_type"] != "mimo"]


@pytest.mark.parametrize("name", ORACLE)
def test_counts_equal_the_transformers_modules(name):
    """Our closed-form count equals the parameters of transformers' own module for the same config (4 layers)."""
    from labkit.memory.model_catalogue import shape_from_entry

    config = _shrunk(MODELS[name]["config"])
    mine = shape_from_entry(name, {**MODELS[name], "config": config})
    assert mine.param_count() == _hf_count(config)


def test_moe_api_by_hand_qwen3_30b_a3b():
    s = model_shape("Qwen3-30B-A3B")
    assert s.is_moe and s.num_moe_layers == 48 and s.moe.num_experts == 128 and s.moe.num_experts_per_tok == 8
    assert s.expert_param_count() == 3 * 2048 * 768
    assert s.router_param_count() == 128 * 2048
    attention = 2048 * 4096 * 2 + 2 * 2048 * 512 + 2 * 128
    assert s.moe_layer_param_count() == attention + 128 * 2048 + 128 * 3 * 2048 * 768 + 2 * 2048
    assert s.layer_param_count() == s.moe_layer_param_count()
    assert s.param_count() - s.active_param_count() == 48 * 120 * s.expert_param_count()


def test_deepseek_v3_dense_and_moe_layers_and_mla():
    s = model_shape("DeepSeek-V3")
    assert s.num_moe_layers == 58 and s.mla.q_lora_rank == 1536 and s.mla.kv_lora_rank == 512
    assert s.dense_layer_param_count() < s.moe_layer_param_count() == s.layer_param_count()
    mla = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    assert s.attention_param_count() == mla
    assert s.moe.shared_expert_intermediate_size == 2048 and s.moe.router_score_bias and s.mtp_layers == 1


def test_hybrid_and_vision_parts():
    nxt = model_shape("Qwen3-Next-80B-A3B")
    assert nxt.layer_types.count("full_attention") == 12 and nxt.layer_type(0) == "linear_attention"
    assert nxt.attention_param_count(0) != nxt.attention_param_count(3)
    vl = model_shape("Qwen2.5-VL-7B")
    assert not vl.is_moe and vl.vision.depth == 32 and vl.vision.patch_size == 14 and vl.vision.spatial_merge_size == 2
    assert vl.param_count() == vl.text_param_count() + vl.vision_param_count()
    assert 6.6e8 < vl.vision_param_count() < 6.8e8
    oss = model_shape("gpt-oss-20b")
    assert oss.attention_sinks and oss.attention_out_bias and oss.moe.router_bias and oss.moe.expert_bias
    assert oss.dense_layer_param_count() > 0 and model_shape("Qwen3-8B").moe_layer_param_count() == 0
    assert model_shape("Gemma-2-9B").norms_per_layer == 4 and model_shape("Gemma-2-9B").tie_word_embeddings


def test_launch_script_models_are_catalogued():
    for name in ("Qwen/Qwen3-30B-A3B-Base", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-235B-A22B",
                 "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-20b", "moonshotai/Moonlight-16B-A3B",
                 "mistralai/Mistral-Nemo-Instruct-2407", "ByteDance-Seed/Seed-OSS-36B-Base", "XiaomiMiMo/MiMo-7B-RL",
                 "Qwen/Qwen2.5-Math-7B", "Qwen/Qwen3-VL-32B-Instruct", "Qwen3-Next-80B-A3B-Instruct",
                 "Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen3-VL-235B-A22B-Instruct", "Qwen/Qwen3.5-35B-A3B",
                 "Qwen/Qwen3.5-122B-A10B", "Qwen/Qwen3.5-397B-A17B", "Qwen3.5-27B", "zai-org/GLM-4.1V-9B-Thinking",
                 "Qwen/Qwen3-8B", "Qwen/Qwen3-32B", "Qwen/Qwen3-4B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-0.6B",
                 "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-32B", "tencent/Hy3",
                 "tencent/Hy3-preview", "deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Flash-Base",
                 "/models/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "Qwen/Qwen3.5-2B", "Qwen/Qwen3.5-4B-Base",
                 "Qwen/Qwen3.5-0.8B"):  # fmt: skip
        from labkit.memory.model_source import known_shape

        assert known_shape(name) is not None, name


@pytest.mark.parametrize(
    "name", [n for n in MODELS if n.startswith("Qwen3.5-") and "checkpoint_total_size_bytes" in MODELS[n]]
)
def test_qwen3_5_equals_its_safetensors_total_size_with_mtp(name):
    """The checkpoint index's total_size (bytes): every tensor bf16 except A_log and the gated norm of each
    linear-attention layer (fp32), MTP layer included: an exact check of the hybrid, vision, tying and MTP counts."""
    e, s = MODELS[name], model_shape(name)
    la = s.linear_attention
    fp32 = s.layer_types.count("linear_attention") * (la.num_value_heads + la.value_head_dim)
    assert 2 * (s.param_count() + s.mtp_param_count()) + 2 * fp32 == e["checkpoint_total_size_bytes"]
    assert s.mtp_layers == 1 and s.vision.kind == "qwen3_vl" and s.vision.deepstack_layers == 0


def test_hy3_with_mtp_equals_its_safetensors_total_size():
    """tencent/Hy3's index total_size: bf16 tensors, and each MoE layer's expert bias (MTP's too) in fp32, which the
    count holds as the router's score-correction bias: an exact check of the dense first layer, the shared expert,
    the q/k norms and the MTP layer."""
    e, s = MODELS["Hy3"], model_shape("Hy3")
    fp32 = (s.num_moe_layers + s.mtp_layers) * s.moe.num_experts
    assert 2 * (s.param_count() + s.mtp_param_count()) + 2 * fp32 == e["checkpoint_total_size_bytes"]
    assert s.num_moe_layers == 79 and not s.is_moe_layer(0) and s.qk_norm


def test_new_architectures_by_hand():
    """Nemotron-H: blocks of one mixer or one MoE each, non-gated experts, Mamba2 mixers; DeepSeek-V4: compressed
    attention kinds, hash-routed layers without a score bias, the hyper-connection head."""
    nano = model_shape("Nemotron-3-Nano-30B-A3B")
    kinds = [nano.layer_type(i) for i in range(nano.num_hidden_layers)]
    assert (kinds.count("mamba"), kinds.count("moe"), kinds.count("full_attention")) == (23, 23, 6)
    assert nano.block_pattern and nano.norms_per_layer == 1 and nano.num_moe_layers == 23
    assert nano.expert_param_count() == 2 * 2688 * 1856 and nano.mlp_param_count(0) == 0
    assert nano.attention_param_count(1) == 0 and nano.attention_param_count(0) == nano.mamba.param_count(2688)
    assert nano.mamba.conv_dim == 6144 and nano.layer_param_counts()[0] == 38_744_896
    v4 = model_shape("DeepSeek-V4-Flash")
    assert v4.num_moe_layers == 43 and v4.moe.hash_layers == 3 and v4.mtp_layers == 1
    assert v4.mlp_param_count(3) - v4.mlp_param_count(2) == 256  # the learned router's score-correction bias
    per_kind = {v4.layer_type(i): v4.attention_param_count(i) for i in range(4)}
    hc = 2 * v4.compressed_attention.hc_param_count(4096)
    assert per_kind["sliding_attention"] - hc == 106_956_352
    assert per_kind["compressed_sparse_attention"] - per_kind["sliding_attention"] == 8_393_216 + 10_749_056
    assert per_kind["heavily_compressed_attention"] - per_kind["sliding_attention"] == 4_260_352


def test_deepseek_v3_with_mtp_is_the_685b_on_hugging_face():
    e, s = MODELS["DeepSeek-V3"], model_shape("DeepSeek-V3")
    with_mtp = s.param_count() + s.mtp_param_count()
    assert abs(with_mtp - e["published_checkpoint_params"]) / e["published_checkpoint_params"] <= 0.01
    assert model_shape("Qwen3-8B").mtp_param_count() == 0
