"""labkit.memory beyond dense full-attention decoders: the rollout's KV cache per kind of layer (MLA's latent,
sliding windows, linear attention's fixed state), MoE's total and active parameters in the phases, and a VL model's
vision tower priced under a stated, changeable assumption."""

from dataclasses import replace

import pytest

from labkit.config.verl_config import load_config
from labkit.memory.choice import settings_for
from labkit.memory.kv_cache import kv_layout
from labkit.memory.model_catalogue import model_shape
from labkit.memory.phase_records import PassShape
from labkit.memory.phases import forward_pass, generate, update_pass
from labkit.memory.term_bytes import moe_forward_bytes, moe_saved_bytes, saved_layer_bytes


def _settings(model, **over):
    return replace(settings_for(load_config(None, ["trainer.n_gpus_per_node=8"]), model), **over)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_mla_caches_the_latent_on_every_tp_rank(tp):
    """DeepSeek-V3: kv_lora_rank 512 + rope 64 per token per layer, not split over TP (no per-head K/V)."""
    m = model_shape("DeepSeek-V3")
    layout = kv_layout(m, 2, tp)
    assert layout.kinds == {"mla": m.num_hidden_layers}
    assert layout.per_token == m.num_hidden_layers * (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * 2
    assert layout.sequence_bytes(1000) == 1000 * layout.per_token


def test_sliding_layers_keep_at_most_their_window():
    """gpt-oss: half the layers slide over 128 tokens; past the window only the full layers grow."""
    m = model_shape("gpt-oss-20b")
    layout = kv_layout(m, 2, 1)
    kinds = [m.layer_type(i) for i in range(m.num_hidden_layers)]
    assert layout.kinds == {k: kinds.count(k) for k in set(kinds)} and layout.window == m.sliding_window == 128
    full = 2 * m.num_key_value_heads * m.head_dim * 2
    assert layout.per_token == kinds.count("full_attention") * full
    assert layout.sequence_bytes(8192) - layout.sequence_bytes(4096) == 4096 * layout.per_token
    assert layout.sequence_bytes(64) == 64 * (layout.per_token + layout.window_per_token)


@pytest.mark.parametrize("name", ["Qwen3-Next-80B-A3B", "Qwen3.5-9B"])
def test_linear_attention_holds_a_fixed_state_not_a_per_token_cache(name):
    m = model_shape(name)
    la, layout = m.linear_attention, kv_layout(m, 2, 1)
    n_linear = sum(m.layer_type(i) == "linear_attention" for i in range(m.num_hidden_layers))
    assert layout.kinds["linear_attention"] == n_linear > 0
    state = la.num_value_heads * la.key_head_dim * la.value_head_dim
    conv = (la.conv_kernel_size - 1) * (2 * la.num_key_heads * la.key_head_dim + la.num_value_heads * la.value_head_dim)
    assert layout.state == n_linear * 2 * (state + conv)
    assert layout.sequence_bytes(4096) - layout.sequence_bytes(2048) == 2048 * layout.per_token
    assert layout.per_token == (m.num_hidden_layers - n_linear) * 2 * m.num_key_value_heads * m.head_dim * 2


def test_generate_prices_a_sequence_by_its_layers_and_states_them():
    s = _settings("Qwen3-Next-80B-A3B", max_model_len=8192, rollout_tp=4)
    g = generate(s)
    layout = kv_layout(s.model, 2, 4)
    assert g.info["kv_bytes_per_sequence"] == layout.sequence_bytes(8192)
    assert g.info["kv_layers"] == {"linear_attention": 36, "full_attention": 12}
    assert g.info["linear_state_bytes_per_sequence"] == layout.state
    assert g.info["sequences_that_fit"] == g.instants["engine"]["kv_cache"] // layout.sequence_bytes(8192)
    assert g.instants["engine"]["rollout_weights"] == 2 * s.model.param_count() // 4  # every expert


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Qwen1.5-MoE-A2.7B", "DeepSeek-V2-Lite", "Mixtral-8x7B"])
def test_a_moe_phase_states_total_and_active_parameters_and_holds_every_expert(name):
    s = _settings(name)
    m = s.model
    for phase in (
        forward_pass(s, "old_log_prob", PassShape(2, 4096)),
        update_pass(s, "update_actor", PassShape(2, 4096)),
    ):
        assert phase.info["total_params"] == m.param_count() > phase.info["active_params"] == m.active_param_count()
    step = update_pass(s, "update_actor", PassShape(2, 4096)).instants["optimizer_step"]
    assert step["params"] + step["grads"] + step["optimizer"] == pytest.approx(16 * m.param_count() / 8, abs=16)
    assert forward_pass(s, "old_log_prob", PassShape(2, 4096)).instants["layer_forward"]["gathered_params"] >= (
        2 * 2 * m.moe_layer_param_count()
    )


def test_moe_activations_grow_with_top_k():
    """Each token is copied to its top-k experts: more experts per token, more routed rows (forward and saved)."""
    m = model_shape("Qwen3-30B-A3B")
    more = replace(m, moe=replace(m.moe, num_experts_per_tok=2 * m.moe.num_experts_per_tok))
    for fn in (moe_forward_bytes, moe_saved_bytes):
        assert fn(more, 4096, 2) > fn(m, 4096, 2) > 0
    assert saved_layer_bytes(more, 4096, 2) - saved_layer_bytes(m, 4096, 2) == 4096 * 8 * 2 * (2 * 2048 + 4 * 768) + (
        4096 * 24 * 8
    )


def test_a_vl_phase_states_its_image_token_assumption_and_prices_it():
    s = _settings("Qwen2.5-VL-7B", gradient_checkpointing=False)
    shape = PassShape(4, 8192)
    low, high = (replace(s, image_tokens_per_sample=n) for n in (256, 1024))
    for fn, name in ((forward_pass, "old_log_prob"), (update_pass, "update_actor")):
        a, b = fn(low, name, shape), fn(high, name, shape)
        assert "256 image tokens per sample" in a.info["vision_assumption"]
        assert a.info["vision_patches"] == 4 * 256 * 4 and a.info["vision_params"] == s.model.vision_param_count()
        assert b.peak_bytes >= a.peak_bytes
    forward = [forward_pass(x, "old_log_prob", shape).instants["vision_forward"] for x in (low, high)]
    assert forward[1]["vision_activations"] == 4 * forward[0]["vision_activations"] > 0  # the head peaks higher
    update = [update_pass(x, "update_actor", shape) for x in (low, high)]
    assert update[1].peak_bytes > update[0].peak_bytes  # every block's saved tensors wait through the decoder
    assert update[1].terms["vision_activations"] == 4 * update[0].terms["vision_activations"]
    text = _settings("Qwen2.5-7B")
    assert "vision_assumption" not in forward_pass(text, "old_log_prob", shape).info
    assert "vision_forward" not in forward_pass(text, "old_log_prob", shape).instants


def test_mla_and_hybrid_training_activations_are_named_as_not_modelled():
    for name in ("DeepSeek-V3", "Qwen3-Next-80B-A3B", "gpt-oss-20b"):
        info = forward_pass(_settings(name), "old_log_prob", PassShape(1, 2048)).info
        assert "not modelled" in info["not_modelled"] or "not traced" in info["not_modelled"]
    assert "not_modelled" not in forward_pass(_settings("Qwen3-8B"), "old_log_prob", PassShape(1, 2048)).info


def test_rollout_weights_split_a_moes_experts_over_tp_times_dp():
    """vLLM holds a MoE's routed experts split over TP·DP (EP = TP·DP, or fused_moe's split) and the rest over TP; a
    dense model's weights do not depend on the rollout's DP. A quantized checkpoint is named, priced in bf16."""
    moe = _settings("Qwen3-30B-A3B", rollout_tp=2)
    m = moe.model
    routed = m.num_moe_layers * m.moe.num_experts * m.expert_param_count()
    one, four = (generate(replace(moe, rollout_dp=dp)).instants["engine"]["rollout_weights"] for dp in (1, 4))
    assert one == 2 * m.param_count() // 2 and one - four == 2 * routed // 2 - 2 * routed // 8
    dense = _settings("Qwen2.5-7B", rollout_tp=2)
    assert len({generate(replace(dense, rollout_dp=dp)).instants["engine"]["rollout_weights"] for dp in (1, 4)}) == 1
    v4 = generate(_settings("DeepSeek-V4-Flash", rollout_tp=8)).info
    assert "fp8 e4m3, experts fp4" in v4["quantized_weights"] and "quantized_weights" not in generate(dense).info


def test_mamba_and_compressed_attention_cache_a_state_or_a_fraction_per_token():
    """Nemotron-H's Mamba2 blocks keep a fixed state per sequence (fp32 SSM state + conv inputs) and its MoE blocks
    nothing; DeepSeek-V4 keeps a 128-token window of one K/V head per layer and a compressed entry every 4 (CSA, with
    the indexer's keys) or 128 tokens (HCA)."""
    nano = kv_layout(model_shape("Nemotron-3-Nano-30B-A3B"), 2, 1)
    assert nano.kinds == {"mamba": 23, "full_attention": 6} and nano.per_token == 6 * 2 * 2 * 128 * 2
    assert nano.state == 23 * (4 * 64 * 64 * 128 + 2 * 3 * 6144)
    v4 = kv_layout(model_shape("DeepSeek-V4-Flash"), 2, 8)
    assert v4.window == 128 and v4.window_per_token == 43 * 512 * 2
    assert v4.per_token == 21 * 2 * (512 + 128) // 4 + 20 * 2 * 512 // 128
