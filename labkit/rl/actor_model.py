"""The actor's model before any rank holds it: its config values for driver-side checks, the fp32 master weights a
rank builds, and everything verl checks before a batch arrives (mesh, E12, E41/E42, profile, legacy E20–E22).
Mirrors the checks of verl/workers/fsdp_workers.py: ActorRolloutRefWorker.__init__ and FSDPActorConfig.validate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from labkit.model.logprob import E12_SP_NEEDS_RMPAD
from labkit.rl import actor_math as am
from labkit.runtime import meshes


def model_config_values(s: am.ActorSettings) -> dict[str, Any]:
    """Head counts etc. without building the model (driver-side checks): model_config, model_path/config.json or
    the shipped tiny config."""
    if s.model_config is not None:
        return dict(s.model_config)
    from labkit.model import tiny_model

    cfg_file = Path(s.model_path or tiny_model.TINY_MODEL_DIR) / "config.json"
    return json.loads(cfg_file.read_text()) if cfg_file.exists() else dict(tiny_model.TINY_CONFIG)


def build_model(s: am.ActorSettings) -> torch.nn.Module:
    """fp32 master weights: a seeded random-init Qwen2 from ``model_config`` (identical on every rank and in a test
    process) or the weights at ``model_path``; sdpa attention, ``use_cache=False`` (packed detection needs it)."""
    if s.model_config is not None:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(s.seed)
        model = Qwen2ForCausalLM(Qwen2Config(**s.model_config, attn_implementation="sdpa"))
    else:
        from labkit.rl.rollout import load_rollout_model

        model, _ = load_rollout_model(s.model_path, "float32")
    model.config.use_cache = False
    return model.float()


def check_settings(s: am.ActorSettings, world_size: int) -> int | None:
    """Everything verl checks before a batch arrives: mesh, E12, E41/E42, profile, legacy E20–E22 (returns M′)."""
    from labkit.model.ulysses import check_ulysses_heads

    sp = s.ulysses_sequence_parallel_size
    meshes.check_actor_mesh(world_size, sp)
    if s.profile not in ("legacy", "engine"):
        raise ValueError(f"profile must be 'legacy' or 'engine', got {s.profile!r}")
    if sp > 1 and not s.use_remove_padding:  # FSDPActorConfig.validate, both versions
        raise ValueError(E12_SP_NEEDS_RMPAD)
    if sp > 1:
        cfg = model_config_values(s)
        check_ulysses_heads(cfg["num_attention_heads"], cfg["num_key_value_heads"], sp)
    if s.optim not in ("adamw", "sgd"):
        raise ValueError(f"optim must be 'adamw' or 'sgd', got {s.optim!r}")
    if s.profile == "legacy":
        return am.legacy_normalized_mini(
            s.ppo_mini_batch_size, s.rollout_n, world_size, sp, s.ppo_micro_batch_size_per_gpu
        )
    return None
