"""verl's start-up batch-size checks, as an ordered list of rules over a snapshot of a config.

Mirrors ``verl/utils/config.py: validate_config`` (with the ``ActorConfig``/``CriticConfig`` dataclass checks it
triggers), then the notices ``verl/trainer/main_ppo.py`` and the workers print before any step (``startup_notices``).
Every check is recorded in execution order, passed or not, with verl's exact message, so a report can show the
arithmetic either way.

Codes are those of docs/errors.md: E1-E45 for verl's own errors; labkit adds B1-B3 (engine bare asserts), X1-X8
(Python/torch errors verl's code runs into), S1-S10 (silent behaviours), N1-N7 (printed notices, conditional failures)
and "GA" (info). The critic's rules are ``startup_critic``, the Megatron backend's ``megatron_checks``; worker init is
``worker_init``, step 1 ``first_step``. Not modelled: the 0.8-only reward-model micro keys (E5).
"""

from __future__ import annotations

from labkit.validate.megatron_checks import actor_engine_config, megatron_validate_config
from labkit.validate.micro_pairs import mutual
from labkit.validate.rulebook import FSDP, REF, STATIC, When, rule, run_rules
from labkit.validate.snapshot import (
    ACTOR_PY,
    AE,
    CFG_PY,
    LOSS_AGG,
    NOTICE,
    RF,
    STARTUP,
    VE,
    R,
    Recorder,
    Snap,
    mod,
)
from labkit.validate.startup_critic import CRITIC_STARTUP_RULES
from labkit.validate.startup_notices import (
    keys_never_read,
    megatron_ignores_checkpointing,
    nccl_timeout_unread,
    ulysses_misses_sequence_mixers,
    v0_loop_deprecated,
)

VALIDATE = f"{CFG_PY}: validate_config"
POST, VAL = f"{ACTOR_PY}: ActorConfig.__post_init__", f"{ACTOR_PY}: ActorConfig.validate"
DEPRECATED_MICRO = When("actor.ppo_micro_batch_size set", lambda s: s.ppo_micro_batch_size is not None)


def actor_sp(s: Snap) -> int:
    """The actor's Ulysses size as ActorConfig.validate reads it (the Megatron actor has none: 1)."""
    return 1 if s.megatron else s.ulysses_sp


@rule("E1", when=FSDP & STATIC)
def real_batch_divisible_by_world(rec: Recorder, s: Snap) -> None:
    B, n, W = s.train_batch_size, s.rollout_n, s.world_size
    rec.add(
        B * n % W != 0,
        "E1",
        AE,
        f"real_train_batch_size ({B * n}) must be divisible by minimal possible batch size ({W})",
        STARTUP,
        VALIDATE,
        [f"real_train_batch_size = B x n = {B} x {n} = {B * n}", f"W = {s.n_gpus_per_node} x {s.nnodes} = {W}",
         mod(B * n, W)],
        "Without dynamic batch size, the rollout batch B x n must split evenly over all W GPUs.",
        role="trainer",
    )  # fmt: skip


@rule("E7 E6", when=STATIC)
def actor_micro_pair(rec: Recorder, s: Snap) -> None:
    mutual(rec, "actor", s.ppo_micro_batch_size, s.ppo_micro_batch_size_per_gpu, POST, "actor", "actor")


@rule("E8")
def loss_agg_mode(rec: Recorder, s: Snap) -> None:
    rec.add(
        s.loss_agg_mode not in LOSS_AGG[s.profile],
        "E8",
        VE,
        f"Invalid loss_agg_mode: {s.loss_agg_mode}",
        STARTUP,
        POST,
        [f"allowed: {', '.join(LOSS_AGG[s.profile])}"],
        "actor.loss_agg_mode is not one verl accepts.",
        role="actor",
    )


@rule("E9", when=STATIC)
def batch_holds_mini(rec: Recorder, s: Snap) -> None:
    B, M = s.train_batch_size, s.ppo_mini_batch_size
    rec.add(
        B < M,
        "E9",
        VE,
        f"train_batch_size ({B}) must be >= actor.ppo_mini_batch_size ({M})",
        STARTUP,
        VAL,
        [f"{B} {'<' if B < M else '>='} {M}"],
        "A mini-batch cannot hold more prompts than the training batch.",
        role="actor",
    )


@rule("E10", when=STATIC & DEPRECATED_MICRO)
def mini_divisible_by_micro(rec: Recorder, s: Snap) -> None:
    M, u = s.ppo_mini_batch_size, s.ppo_micro_batch_size
    rec.add(
        M % u != 0,
        "E10",
        VE,
        f"ppo_mini_batch_size ({M}) must be divisible by ppo_micro_batch_size ({u})",
        STARTUP,
        VAL,
        [mod(M, u)],
        "The deprecated global micro size must divide the mini-batch.",
        role="actor",
    )


@rule("E11", when=STATIC & DEPRECATED_MICRO)
def micro_covers_world(rec: Recorder, s: Snap) -> None:
    u, sp, W = s.ppo_micro_batch_size, actor_sp(s), s.world_size
    rec.add(
        u * sp < W,
        "E11",
        VE,
        f"ppo_micro_batch_size ({u}) * ulysses_sequence_parallel_size ({sp}) must be >= n_gpus ({W})",
        STARTUP,
        VAL,
        [f"{u} x {sp} = {u * sp} {'<' if u * sp < W else '>='} {W}"],
        "The deprecated global micro size is divided over the DP ranks and must leave at least 1 row each.",
        role="actor",
    )


@rule("E12")
def sp_needs_remove_padding(rec: Recorder, s: Snap) -> None:
    """FSDPActorConfig.validate (recorded as passed under Megatron, whose actor has no Ulysses size)."""
    sp = actor_sp(s)
    rec.add(
        sp > 1 and not s.use_remove_padding and not s.megatron,
        "E12",
        VE,
        "When using sequence parallelism for actor/ref policy, you must enable `use_remove_padding`.",
        STARTUP,
        f"{ACTOR_PY}: FSDPActorConfig.validate",
        [f"ulysses_sequence_parallel_size = {sp}", f"model.use_remove_padding = {s.use_remove_padding}"],
        "Ulysses sequence parallelism slices packed sequences, so padding removal must be on.",
        role="actor",
    )


@rule("E3 E4", when=STATIC & REF)
def ref_log_prob_micro_pair(rec: Recorder, s: Snap) -> None:
    mutual(rec, RF, s.ref_log_prob_micro_batch_size, s.ref_log_prob_micro_batch_size_per_gpu, VALIDATE, "lp", "ref")


@rule("E3 E4", when=STATIC)
def rollout_log_prob_micro_pair(rec: Recorder, s: Snap) -> None:
    mutual(rec, R, s.log_prob_micro_batch_size, s.log_prob_micro_batch_size_per_gpu, VALIDATE, "lp", "rollout")


@rule("N1")
def kl_applied_twice(rec: Recorder, s: Snap) -> None:
    rec.add(
        bool(s.use_kl_in_reward and s.use_kl_loss),
        "N1",
        None,
        "NOTICE: You have both enabled in-reward kl and kl loss.",
        STARTUP,
        VALIDATE,
        ["algorithm.use_kl_in_reward = True", "actor.use_kl_loss = True"],
        "verl only prints this: the KL is applied twice, once in the reward and once in the loss.",
        NOTICE,
    )


@rule("N2")
def val_batch_size_deprecated(rec: Recorder, s: Snap) -> None:
    rec.add(
        s.val_batch_size is not None,
        "N2",
        None,
        "WARNING: val_batch_size is deprecated. Validation datasets are sent to "
        "inference engines as a whole batch, which will schedule the memory themselves.",
        STARTUP,
        VALIDATE,
        [f"data.val_batch_size = {s.val_batch_size}"],
        "verl prints this and ignores data.val_batch_size.",
        NOTICE,
    )


@rule("E19", when=When("val_kwargs.do_sample", lambda s: s.val_do_sample))
def val_temperature_positive(rec: Recorder, s: Snap) -> None:
    rec.add(
        s.temperature <= 0,
        "E19",
        AE,
        "validation gen temperature should be greater than 0 when enabling do_sample",
        STARTUP,
        VALIDATE,
        [f"rollout.temperature = {s.temperature}"],
        "With val_kwargs.do_sample the check reads rollout.temperature (not val_kwargs.temperature).",
        role="rollout",
    )


STARTUP_RULES = (
    megatron_validate_config,  # E2, minimal_bsz = DP x m (M1), E1
    actor_engine_config,  # McoreEngineConfig (M2, M3)
    real_batch_divisible_by_world,
    actor_micro_pair,
    loss_agg_mode,
    batch_holds_mini,
    mini_divisible_by_micro,
    micro_covers_world,
    sp_needs_remove_padding,
    ref_log_prob_micro_pair,
    rollout_log_prob_micro_pair,
    kl_applied_twice,
    *CRITIC_STARTUP_RULES,
    val_batch_size_deprecated,
    val_temperature_positive,
    v0_loop_deprecated,
    nccl_timeout_unread,
    megatron_ignores_checkpointing,
    keys_never_read,
    ulysses_misses_sequence_mixers,
)
"""validate_config's checks in the order its code runs them, then main_ppo's and the workers' start-up notices."""


def startup_checks(rec: Recorder, s: Snap) -> None:
    """Mirrors verl/utils/config.py: validate_config, in the order its code runs."""
    run_rules(STARTUP_RULES, rec, s)
