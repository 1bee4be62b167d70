"""verl's start-up checks of the critic section, as rules: ``CriticConfig.__post_init__`` / ``validate`` and
``FSDPCriticConfig``'s (E13-E18), in the order ``verl/utils/config.py: validate_config`` runs them when verl builds a
critic; under Megatron the critic's ``McoreEngineConfig`` (M2, M3) comes first. ``startup`` lists them in place.
"""

from __future__ import annotations

from labkit.validate.megatron_checks import critic_engine_config
from labkit.validate.micro_pairs import mutual
from labkit.validate.rulebook import CRITIC, CRITIC_STATIC, FSDP, LEGACY, When, rule
from labkit.validate.snapshot import CRITIC_PY, STARTUP, VE, Recorder, Snap, mod

POST = f"{CRITIC_PY}: CriticConfig.__post_init__"
DEPRECATED_MICRO = When("critic.ppo_micro_batch_size set", lambda s: s.critic_ppo_micro_batch_size is not None)


@rule("E13 E14", when=CRITIC & CRITIC_STATIC)
def critic_micro_pair(rec: Recorder, s: Snap) -> None:
    """CriticConfig._check_mutually_exclusive on critic.ppo_micro_batch_size(_per_gpu)."""
    mutual(
        rec, "critic", s.critic_ppo_micro_batch_size, s.critic_ppo_micro_batch_size_per_gpu, POST, "critic", "critic"
    )


@rule("E15", when=CRITIC & CRITIC_STATIC & DEPRECATED_MICRO)
def critic_mini_divisible_by_micro(rec: Recorder, s: Snap) -> None:
    M, u = s.critic_ppo_mini_batch_size, s.critic_ppo_micro_batch_size
    rec.add(
        M % u != 0,
        "E15",
        VE,
        f"[critic] ppo_mini_batch_size ({M}) must be divisible by ppo_micro_batch_size ({u})",
        STARTUP,
        POST,
        [mod(M, u)],
        "The deprecated critic micro size must divide the critic mini-batch.",
        role="critic",
    )


@rule("E18", when=CRITIC & LEGACY & FSDP)
def critic_sp_needs_remove_padding(rec: Recorder, s: Snap) -> None:
    """FSDPCriticConfig.__post_init__ (0.7.1; McoreCriticConfig has no Ulysses size)."""
    rec.add(
        s.critic_ulysses_sp > 1 and not s.critic_use_remove_padding,
        "E18",
        VE,
        "When using sequence parallelism for critic, you must enable `use_remove_padding`.",
        STARTUP,
        f"{CRITIC_PY}: FSDPCriticConfig.__post_init__",
        [
            f"critic.ulysses_sequence_parallel_size = {s.critic_ulysses_sp}",
            f"critic.model.use_remove_padding = {s.critic_use_remove_padding}",
        ],
        "Critic sequence parallelism needs padding removal (checked on critic.model).",
        role="critic",
    )


@rule("E16", when=CRITIC & CRITIC_STATIC)
def critic_batch_holds_mini(rec: Recorder, s: Snap) -> None:
    B, M = s.train_batch_size, s.critic_ppo_mini_batch_size
    rec.add(
        B < M,
        "E16",
        VE,
        f"train_batch_size ({B}) must be >= critic.ppo_mini_batch_size ({M})",
        STARTUP,
        f"{CRITIC_PY}: CriticConfig.validate",
        [f"{B} {'<' if B < M else '>='} {M}"],
        "A critic mini-batch cannot hold more prompts than the training batch.",
        role="critic",
    )


@rule("E17", when=CRITIC & CRITIC_STATIC & DEPRECATED_MICRO & FSDP)
def critic_micro_covers_world(rec: Recorder, s: Snap) -> None:
    """FSDPCriticConfig.validate only."""
    u, sp, W = s.critic_ppo_micro_batch_size, s.critic_ulysses_sp, s.world_size
    rec.add(
        u * sp < W,
        "E17",
        VE,
        f"critic.ppo_micro_batch_size ({u}) * ulysses_sequence_parallel_size ({sp}) must be >= n_gpus ({W})",
        STARTUP,
        f"{CRITIC_PY}: FSDPCriticConfig.validate",
        [f"{u} x {sp} = {u * sp} {'<' if u * sp < W else '>='} {W}"],
        "The deprecated critic micro size must leave at least 1 row per DP rank.",
        role="critic",
    )


CRITIC_STARTUP_RULES = (
    critic_engine_config,
    critic_micro_pair,
    critic_mini_divisible_by_micro,
    critic_sp_needs_remove_padding,
    critic_batch_holds_mini,
    critic_micro_covers_world,
)
"""CriticConfig's checks, in the order validate_config triggers them."""
