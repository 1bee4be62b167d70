"""How the memory settings read the keys labkit's config schema does not model (kept as the user set them) and the
keys whose place depends on the profile: dtypes (verl's ``PrecisionType`` names), boolean flags, the actor's LoRA
block (``model.lora.*`` in 0.9.1, ``model.lora_rank`` before), where the critic's FSDP settings and the entropy's
compile switch live, and the release's memory behaviour. ``labkit.memory.settings.MemorySettings.from_config`` is
their one reader.
"""

from __future__ import annotations

from typing import Any

from labkit.config.keys import ACTOR, MODEL
from labkit.memory.lora import LoraError, LoraSpec, lora_spec
from labkit.memory.megatron_lora import MEGATRON_DEFAULT_TARGETS, hf_targets
from labkit.memory.shapes import ModelShape
from labkit.rules.parallel_layout import MEGATRON, engine_of

DTYPE_BYTES = {"float32": 4, "fp32": 4, "32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "16": 2}


def compile_key(profile: str) -> str:
    """The key that compiles the actor's entropy: the legacy workers' ``actor.use_torch_compile`` (``dp_actor.py``);
    the engine's own ``actor.fsdp_config.use_torch_compile`` (``engine/fsdp/transformer_impl.py``, not
    interpolated from the actor's key, which the engine never reads)."""
    return f"{ACTOR}.use_torch_compile" if profile == "legacy" else f"{ACTOR}.fsdp_config.use_torch_compile"


def release_memory(cfg: Any) -> dict[str, bool]:
    """The memory behaviour of the release ``--verl`` names (``labkit.config.versions.ReleaseMemory``)."""
    if cfg.release is None:
        return {}
    m = cfg.release.memory
    return dict(
        entropy_always=m.entropy_always,
        ce_inplace_backward=m.ce_inplace_backward,
        vllm_share_of_free=m.vllm_share_of_free,
        actor_in_generate=m.actor_in_generate,
        ref_offloaded=m.ref_offloaded,
    )


def critic_fsdp(profile: str) -> str:
    """Where the critic's FSDP settings live: ``critic.model.fsdp_config`` (legacy workers), ``critic.fsdp`` (the
    engine's CriticConfig)."""
    return "critic.model.fsdp_config" if profile == "legacy" else "critic.fsdp"


def actor_lora(cfg: Any, m: ModelShape) -> LoraSpec | None:
    """The actor's adapters as verl reads them: ``model.lora.rank`` (0.9.1), else ``model.lora_rank``, over
    ``target_modules``/``exclude_modules`` of the same block; None without LoRA. ConfigError for a negative rank
    (verl would silently train the whole model) or a target no module has (PEFT's error)."""
    nested = raw_value(cfg, f"{MODEL}.lora.rank")
    block = f"{MODEL}.lora." if nested not in (None, 0, "0") else f"{MODEL}."
    rank = nested if block.endswith("lora.") else raw_value(cfg, f"{MODEL}.lora_rank", 0)
    try:
        rank = int(rank)
    except (TypeError, ValueError):
        from labkit.config.messages import ConfigError

        raise ConfigError(
            f"'{block}{'rank' if block.endswith('lora.') else 'lora_rank'}' is {rank!r}; verl reads an integer"
        ) from None
    if rank == 0:
        return None
    megatron = engine_of(cfg) == MEGATRON  # Megatron-Bridge: megatron-core's module names
    targets = raw_value(cfg, f"{block}target_modules", MEGATRON_DEFAULT_TARGETS if megatron else "all-linear")
    exclude = raw_value(cfg, f"{block}exclude_modules")
    merge = str(raw_value(cfg, f"{MODEL}.lora.merge", False)).lower() == "true"
    try:
        if rank < 0:
            raise LoraError(
                f"{block}{'rank' if block.endswith('lora.') else 'lora_rank'}={rank}: verl applies LoRA only for a "
                "rank above 0 (0: no LoRA); a negative rank would silently train the whole model"
            )
        targets = hf_targets(targets) if megatron else _hashable(targets)
        return lora_spec(m, rank, targets, _hashable(exclude), merge)
    except LoraError as exc:
        from labkit.config.messages import ConfigError

        raise ConfigError(str(exc)) from None


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def raw_value(cfg: Any, key: str, default: Any = None) -> Any:
    """A verl key labkit's config schema does not model, as the user set it (kept among the ignored or added
    overrides), else ``default`` (``VerlConfig.raw``: the read is recorded)."""
    return cfg.raw(key, default)


def dtype_bytes(cfg: Any, key: str, default: int) -> int:
    """Bytes of the dtype a key names (verl's ``PrecisionType``: fp32/float32, bf16/bfloat16, fp16/float16), or
    ``default`` when the key is not set; ConfigError for a name verl would not read."""
    raw = raw_value(cfg, key)
    if raw is None:
        return default
    text = str(raw).strip().lower().removeprefix("torch.")
    if text not in DTYPE_BYTES:
        from labkit.config.messages import ConfigError

        raise ConfigError(f"'{key}' is {raw!r}; verl reads fp32, bf16 or fp16 (float32, bfloat16, float16)")
    return DTYPE_BYTES[text]


def flag(cfg: Any, key: str, default: bool) -> bool:
    """A boolean verl key labkit's config does not model (kept among the ignored overrides), or verl's default."""
    raw = cfg.raw(key, default)
    return raw if isinstance(raw, bool) else str(raw).strip().lower() in ("true", "1", "yes")
