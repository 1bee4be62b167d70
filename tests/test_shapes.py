"""labkit.memory.shapes: real model shapes and GPU capacities, checked against published and exact parameter counts."""

from __future__ import annotations

import json
import math
import re

import pytest

from labkit.memory.shapes import ARCHITECTURES, DATA, gpu, gpu_names, model_names, model_shape

MODELS = json.loads((DATA / "model_shapes.json").read_text())["models"]
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
    shape = model_shape(name)
    rel = abs(shape.param_count() - shape.published_params) / shape.published_params
    assert rel <= 0.01, (name, rel)


@pytest.mark.parametrize("name", list(MODELS))
def test_param_count_is_exactly_the_independent_count(name):
    assert model_shape(name).param_count() == MODELS[name]["exact_params"]


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


@pytest.mark.parametrize("name", list(MODELS))
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
