"""The keys labkit's memory model reads, over configs that exercise every part of it (FSDP with a reference and with
a critic, LoRA, Megatron with its CPU optimizer and uneven stages, SGLang, the legacy and old releases): what the
key registry must call priced (tests/test_key_effects.py)."""

from __future__ import annotations

from labkit.config import versions
from labkit.config.verl_config import load_config
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import step_phases

A, M, R = "actor_rollout_ref.actor", "actor_rollout_ref.model", "actor_rollout_ref.rollout"
MEG = f"{A}.megatron.override_transformer_config"
OPT = f"{A}.optim.override_optimizer_config"
CONFIGS: list[tuple[list[str], str, str | None, str]] = [
    (["algorithm.adv_estimator=grpo", f"{A}.use_kl_loss=True"], "engine", None, "Qwen2.5-7B"),
    (["algorithm.adv_estimator=gae", "critic.model.path=Qwen/Qwen2.5-7B"], "engine", None, "Qwen2.5-7B"),
    (["algorithm.adv_estimator=gae", "critic.model.path=Qwen/Qwen2.5-7B"], "legacy", None, "Qwen2.5-7B"),
    ([f"{A}.use_kl_loss=True", f"{M}.lora_rank=32", f"{M}.target_modules=all-linear"], "legacy", None, "Qwen2.5-7B"),
    (
        [f"{M}.lora.rank=16", f"{M}.lora.target_modules=[q_proj]", f"{M}.lora.merge=false", f"{R}.name=sglang"],
        "engine",
        None,
        "Qwen2.5-7B",
    ),
    (["algorithm.adv_estimator=grpo", f"{A}.fsdp_config.model_dtype=bf16"], "legacy", "0.2", "Qwen2.5-7B"),
    (
        [
            "model_engine=megatron",
            f"{A}.use_kl_loss=True",
            f"{A}.megatron.pipeline_model_parallel_size=2",
            f"+{MEG}.account_for_embedding_in_pipeline_split=True",
            f"+{MEG}.account_for_loss_in_pipeline_split=True",
            f"+{OPT}.optimizer_cpu_offload=True",
            f"+{OPT}.optimizer_offload_fraction=0.5",
            f"{A}.optim.use_precision_aware_optimizer=True",
            f"+{OPT}.main_params_dtype=fp32",
            f"+{OPT}.main_grads_dtype=bf16",
            "algorithm.adv_estimator=gae",
            "critic.model.path=Qwen/Qwen2.5-7B",
            "critic.optim.use_precision_aware_optimizer=True",
            "+critic.optim.override_optimizer_config.optimizer_cpu_offload=True",
        ],
        "engine",
        None,
        "Qwen2.5-7B",
    ),
]


def memory_reads() -> set[str]:
    """Every key the settings and the phases read over ``CONFIGS``."""
    read: set[str] = set()
    for overrides, profile, release, model in CONFIGS:
        cfg = load_config(None, overrides, profile=profile)
        if release:
            cfg = versions.apply_release(cfg, versions.release(release))
        with cfg.recording() as keys:
            step_phases(cfg, MemorySettings.from_config(cfg, model, 80 * 2**30))
        read |= keys
    return read
