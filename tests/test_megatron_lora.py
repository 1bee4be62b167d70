"""LoRA on Megatron (Megatron-Bridge's PEFT, verl 0.9): the base frozen, DDP's grads and the optimizer on the
adapters only, the reference the actor, the adapters split over TP; megatron-core's module names read as the
linears they fuse."""

from __future__ import annotations

import pytest

from labkit.config.messages import ConfigError
from labkit.config.verl_config import load_config
from labkit.memory.choice import settings_for
from labkit.memory.megatron_lora import MEGATRON_DEFAULT_TARGETS, hf_targets, layer_adapters
from labkit.memory.megatron_params import model_states
from labkit.memory.model_catalogue import model_shape
from labkit.memory.step_memory import step_phases
from labkit.rules.run import as_run

BASE = [
    "model_engine=megatron",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    "data.train_batch_size=64",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.use_kl_loss=true",
]


def _phases(*extra: str):
    run = as_run(load_config(overrides=[*BASE, *extra]))
    s = settings_for(run, None, "H100-80GB")
    return s, run, step_phases(run, s)


def test_the_default_targets_are_the_four_fused_linears_and_split_over_tp() -> None:
    s, run, _ = _phases("+actor_rollout_ref.model.lora.rank=32")
    m, r = model_shape("Qwen2.5-7B"), 32
    h, i, d = m.hidden_size, m.intermediate_size, m.head_dim
    q, kv = m.num_attention_heads * d, m.num_key_value_heads * d
    fused = r * ((h + q + 2 * kv) + (q + h) + (h + 2 * i) + (i + h))  # qkv, proj, fc1 (gate+up), fc2: one A each
    assert hf_targets(list(MEGATRON_DEFAULT_TARGETS)) == (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )  # fmt: skip
    assert layer_adapters(m, s.lora, 0, run.layout) == (fused // 2, 0)


def test_the_frozen_base_keeps_no_main_grads_or_adam_states_and_the_reference_is_the_actor() -> None:
    full_s, _, full = _phases()
    s, run, lora = _phases("+actor_rollout_ref.model.lora.rank=32")
    states = model_states(s.model, run.layout, 0, opt=None, lora=s.lora)
    base = model_states(s.model, run.layout, 0)
    adapters = (states["params"] - base["params"]) // 2
    assert 0 < adapters < base["params"] // 100  # rank-32 adapters: well under 1% of the base
    assert states["grads"] == 4 * adapters  # fp32 main grads of the adapters only
    assert states["optimizer"] == int(12 * adapters / run.layout.dp_size)  # distributed Adam over DP
    terms = lora["update_actor"].instants[next(iter(lora["update_actor"].instants))]
    assert terms["fp32_main_grads"] == states["grads"] and "ref_bf16_params" not in terms
    assert "ref_bf16_params" in full["update_actor"].instants[next(iter(full["update_actor"].instants))]
    saved = full["update_actor"].peak_bytes - lora["update_actor"].peak_bytes
    assert saved > (base["grads"] - states["grads"]) + (base["optimizer"] - states["optimizer"])  # + the ref's params


def test_fewer_targets_fewer_adapters_and_a_name_no_module_has_is_refused() -> None:
    s_all, run, _ = _phases("+actor_rollout_ref.model.lora.rank=32")
    s_qkv, _, _ = _phases(
        "+actor_rollout_ref.model.lora.rank=32", "+actor_rollout_ref.model.lora.target_modules=[linear_qkv]"
    )
    m = s_all.model
    assert 0 < layer_adapters(m, s_qkv.lora, 0, run.layout)[0] < layer_adapters(m, s_all.lora, 0, run.layout)[0]
    with pytest.raises(ConfigError, match="not found in the base model"):
        _phases("+actor_rollout_ref.model.lora.rank=32", "+actor_rollout_ref.model.lora.target_modules=[linear_xyz]")


def test_a_moe_model_adapts_every_local_expert_over_etp() -> None:
    s, run, _ = _phases(
        "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4",
        "+actor_rollout_ref.model.lora.rank=16",
    )
    m = s.model
    total, experts = layer_adapters(m, s.lora, 0, run.layout)
    moe = m.moe
    per_expert = 16 * ((m.hidden_size + 2 * moe.moe_intermediate_size) + (moe.moe_intermediate_size + m.hidden_size))
    assert experts == moe.num_experts // 4 * per_expert // run.layout.etp
    assert total > experts
