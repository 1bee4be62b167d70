"""verl's start-up and worker-init batch-size checks, as rules over a snapshot of a config.

Mirrors ``verl/utils/config.py: validate_config`` (with the ``ActorConfig``/``CriticConfig`` dataclass checks it
triggers), the legacy worker normalisation of ``verl/workers/fsdp_workers.py`` (0.7.1/0.8) and the engine
worker asserts of ``verl/workers/engine_workers.py`` (0.9.1). Every check is recorded in execution order,
passed or not, with verl's exact message, so a report can show the arithmetic either way.

Codes are those of docs/errors.md: E1-E45 for verl's own errors; labkit adds B1-B3 (engine bare asserts), X1-X4 (Python/torch errors
verl's code runs into: ZeroDivisionError, split(0), a None micro size, a Ulysses mesh that does not cover W),
S1-S4 (silent behaviours), N1-N5 (printed notices, conditional failures) and "GA" (info). The snapshot and recorder
are ``labkit.validate.snapshot``; worker-init rules live in ``worker_init``, step-1 rules in ``first_step``; the Megatron
backend's (E2, M1-M25) in ``megatron_checks``. Not modelled: the 0.8-only reward-model micro keys (E5).
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.validate.megatron_checks import critic_engine_config, megatron_startup
from labkit.validate.snapshot import (
    ACTOR_PY,
    AE,
    CFG_PY,
    CRITIC_PY,
    LOSS_AGG,
    NOTICE,
    RF,
    SILENT,
    STARTUP,
    VE,
    R,
    Run,
    Snap,
    mod,
)


def mutual(
    run: Run, name: str, dep: int | None, per_gpu: int | None, where: str, kind: str, role: str, when: str = STARTUP
) -> None:
    """validate_config.check_mutually_exclusive / *Config._check_mutually_exclusive: E3/E4, E6/E7, E13/E14."""
    sec = {"lp": name, "actor": "actor", "critic": "critic"}[kind]
    param = {"lp": "log_prob_micro_batch_size", "actor": "ppo_micro_batch_size", "critic": "micro_batch_size"}[kind]
    codes = {"lp": ("E3", "E4"), "actor": ("E7", "E6"), "critic": ("E13", "E14")}[kind]
    arith = [f"{sec}.{param} = {dep}", f"{sec}.{param}_per_gpu = {per_gpu}"]
    tail = " if use_dynamic_bsz is not enabled." if kind == "actor" else "."
    run.add(
        dep is None and per_gpu is None,
        codes[0],
        AE if kind == "actor" else VE,
        f"[{sec}] Please set at least one of '{sec}.{param}' or '{sec}.{param}_per_gpu'{tail}",
        when,
        where,
        arith,
        f"Static micro-batching needs a micro-batch size for {name}; neither key is set.",
        role=role,
    )
    run.add(
        dep is not None and per_gpu is not None,
        codes[1],
        VE,
        f"[{sec}] You have set both '{sec}.{param}' AND '{sec}.{param}_per_gpu'. Please remove '{sec}.{param}' "
        f"because only '*_{param}_per_gpu' is supported (the former is deprecated).",
        when,
        where,
        arith,
        "The deprecated global key and its per-GPU replacement are mutually exclusive."
        + (
            " critic.ppo_micro_batch_size_per_gpu interpolates from critic.ppo_micro_batch_size, so setting only"
            " the deprecated key also trips this."
            if kind == "critic"
            else ""
        ),
        role=role,
    )


def startup_checks(run: Run, s: Snap) -> None:
    """Mirrors verl/utils/config.py: validate_config, in the order its code runs."""
    W, B, M, n, sp = s.world_size, s.train_batch_size, s.ppo_mini_batch_size, s.rollout_n, s.ulysses_sp
    if s.megatron:
        megatron_startup(run, s)  # E2, minimal_bsz = DP x m (M1, E1), then McoreEngineConfig (M2, M3)
        sp = 1  # the Megatron actor has no Ulysses size: ActorConfig.validate reads 1
    elif not s.use_dynamic_bsz:
        run.add(
            s.train_batch_size * n % W != 0,
            "E1",
            AE,
            f"real_train_batch_size ({B * n}) must be divisible by minimal possible batch size ({W})",
            STARTUP,
            f"{CFG_PY}: validate_config",
            [
                f"real_train_batch_size = B x n = {B} x {n} = {B * n}",
                f"W = {s.n_gpus_per_node} x {s.nnodes} = {W}",
                mod(B * n, W),
            ],
            "Without dynamic batch size, the rollout batch B x n must split evenly over all W GPUs.",
            role="trainer",
        )
    post, val = f"{ACTOR_PY}: ActorConfig.__post_init__", f"{ACTOR_PY}: ActorConfig.validate"
    if not s.use_dynamic_bsz:
        mutual(run, "actor", s.ppo_micro_batch_size, s.ppo_micro_batch_size_per_gpu, post, "actor", "actor")
    run.add(
        s.loss_agg_mode not in LOSS_AGG[s.profile],
        "E8",
        VE,
        f"Invalid loss_agg_mode: {s.loss_agg_mode}",
        STARTUP,
        post,
        [f"allowed: {', '.join(LOSS_AGG[s.profile])}"],
        "actor.loss_agg_mode is not one verl accepts.",
        role="actor",
    )
    if not s.use_dynamic_bsz:
        run.add(
            B < M,
            "E9",
            VE,
            f"train_batch_size ({B}) must be >= actor.ppo_mini_batch_size ({M})",
            STARTUP,
            val,
            [f"{B} {'<' if B < M else '>='} {M}"],
            "A mini-batch cannot hold more prompts than the training batch.",
            role="actor",
        )
        if s.ppo_micro_batch_size is not None:
            run.add(
                M % s.ppo_micro_batch_size != 0,
                "E10",
                VE,
                f"ppo_mini_batch_size ({M}) must be divisible by ppo_micro_batch_size ({s.ppo_micro_batch_size})",
                STARTUP,
                val,
                [mod(M, s.ppo_micro_batch_size)],
                "The deprecated global micro size must divide the mini-batch.",
                role="actor",
            )
            run.add(
                s.ppo_micro_batch_size * sp < W,
                "E11",
                VE,
                f"ppo_micro_batch_size ({s.ppo_micro_batch_size}) * ulysses_sequence_parallel_size ({sp}) "
                f"must be >= n_gpus ({W})",
                STARTUP,
                val,
                [
                    f"{s.ppo_micro_batch_size} x {sp} = {s.ppo_micro_batch_size * sp} {'<' if s.ppo_micro_batch_size * sp < W else '>='} {W}"
                ],
                "The deprecated global micro size is divided over the DP ranks and must leave at least 1 row each.",
                role="actor",
            )
    run.add(
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
    if not s.use_dynamic_bsz:
        if s.need_ref:
            mutual(
                run,
                RF,
                s.ref_log_prob_micro_batch_size,
                s.ref_log_prob_micro_batch_size_per_gpu,
                f"{CFG_PY}: validate_config",
                "lp",
                "ref",
            )
        mutual(
            run,
            R,
            s.log_prob_micro_batch_size,
            s.log_prob_micro_batch_size_per_gpu,
            f"{CFG_PY}: validate_config",
            "lp",
            "rollout",
        )
    run.add(
        bool(s.use_kl_in_reward and s.use_kl_loss),
        "N1",
        None,
        "NOTICE: You have both enabled in-reward kl and kl loss.",
        STARTUP,
        f"{CFG_PY}: validate_config",
        ["algorithm.use_kl_in_reward = True", "actor.use_kl_loss = True"],
        "verl only prints this: the KL is applied twice, once in the reward and once in the loss.",
        NOTICE,
    )
    if s.need_critic:
        _critic_startup(run, s)
    run.add(
        s.val_batch_size is not None,
        "N2",
        None,
        "WARNING: val_batch_size is deprecated. Validation datasets are sent to "
        "inference engines as a whole batch, which will schedule the memory themselves.",
        STARTUP,
        f"{CFG_PY}: validate_config",
        [f"data.val_batch_size = {s.val_batch_size}"],
        "verl prints this and ignores data.val_batch_size.",
        NOTICE,
    )
    if s.val_do_sample:
        run.add(
            s.temperature <= 0,
            "E19",
            AE,
            "validation gen temperature should be greater than 0 when enabling do_sample",
            STARTUP,
            f"{CFG_PY}: validate_config",
            [f"rollout.temperature = {s.temperature}"],
            "With val_kwargs.do_sample the check reads rollout.temperature (not val_kwargs.temperature).",
            role="rollout",
        )
    release = s.cfg.release
    run.add(  # main_ppo.main, after validate_config: the only switch between the two 0.9.x loops (0.8.0 has one)
        s.geo.loop == "v0" and (release is None or release.use_v1 is not False),
        "N7",
        None,
        message("N7"),
        STARTUP,
        "verl/trainer/main_ppo.py: main",
        ["trainer.use_v1 = false"],
        "verl 0.9.1 warns that its v0 loop (RayPPOTrainer) is deprecated; labkit models it with trainer.use_v1=false.",
        NOTICE,
        role="trainer",
    )
    timeouts = [k for k in NCCL_TIMEOUT_KEYS if k in s.cfg.ignored or k in s.cfg.added]
    run.add(  # engine workers build their process group with timeout=None: nothing reads the key
        s.profile == "engine" and bool(timeouts),
        "S7",
        None,
        message("S7", keys=", ".join(timeouts)),
        STARTUP,
        "verl/workers/engine_workers.py: __init__ (initialize_global_process_group_ray(timeout_second=None))",
        [f"{k} = {s.cfg.ignored.get(k, s.cfg.added.get(k))}" for k in timeouts],
        "verl 0.9.1's engine workers start torch.distributed with timeout=None (torch's default, 10 minutes for "
        "NCCL) and never read nccl_timeout; CriticConfig only declares it. The legacy workers (0.7.1) passed it to "
        "init_process_group.",
        SILENT,
        role="trainer",
    )

    checkpointing = "actor_rollout_ref.model.enable_gradient_checkpointing"
    run.add(  # the Megatron engine takes recompute from override_transformer_config only
        s.geo.parallel.is_megatron and s.cfg.is_set(checkpointing) and bool(s.cfg.get(checkpointing)),
        "S8",
        None,
        message("S8"),
        STARTUP,
        "verl/workers/engine/megatron/transformer_impl.py (the key is read by the FSDP engine only)",
        [
            f"{checkpointing} = true",
            "megatron.override_transformer_config.recompute_granularity = "
            f"{s.cfg.get('actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity')}",
        ],
        "The Megatron engine never reads model.enable_gradient_checkpointing: activations are recomputed only as "
        "override_transformer_config.recompute_granularity/method/num_layers say.",
        SILENT,
        role="actor",
    )


NCCL_TIMEOUT_KEYS = ("actor_rollout_ref.nccl_timeout", "critic.nccl_timeout")
"""Keys users raise to cure a hang that verl 0.9.1's engine workers never read."""


def _critic_startup(run: Run, s: Snap) -> None:
    """CriticConfig.__post_init__/validate and FSDPCriticConfig's (E13-E18), as validate_config runs them."""
    post, W = f"{CRITIC_PY}: CriticConfig.__post_init__", s.world_size
    if s.megatron:  # McoreCriticConfig's own McoreEngineConfig (critic.megatron: its literal defaults, TP = 1)
        critic_engine_config(run, s)
    if not s.critic_use_dynamic_bsz:
        mutual(
            run,
            "critic",
            s.critic_ppo_micro_batch_size,
            s.critic_ppo_micro_batch_size_per_gpu,
            post,
            "critic",
            "critic",
        )
        if s.critic_ppo_micro_batch_size is not None:
            run.add(
                s.critic_ppo_mini_batch_size % s.critic_ppo_micro_batch_size != 0,
                "E15",
                VE,
                f"[critic] ppo_mini_batch_size ({s.critic_ppo_mini_batch_size}) must be divisible by "
                f"ppo_micro_batch_size ({s.critic_ppo_micro_batch_size})",
                STARTUP,
                post,
                [mod(s.critic_ppo_mini_batch_size, s.critic_ppo_micro_batch_size)],
                "The deprecated critic micro size must divide the critic mini-batch.",
                role="critic",
            )
    if s.legacy and not s.megatron:  # FSDPCriticConfig only (McoreCriticConfig has no Ulysses size)
        run.add(
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
    if not s.critic_use_dynamic_bsz:
        run.add(
            s.train_batch_size < s.critic_ppo_mini_batch_size,
            "E16",
            VE,
            f"train_batch_size ({s.train_batch_size}) must be >= critic.ppo_mini_batch_size ({s.critic_ppo_mini_batch_size})",
            STARTUP,
            f"{CRITIC_PY}: CriticConfig.validate",
            [
                f"{s.train_batch_size} {'<' if s.train_batch_size < s.critic_ppo_mini_batch_size else '>='} {s.critic_ppo_mini_batch_size}"
            ],
            "A critic mini-batch cannot hold more prompts than the training batch.",
            role="critic",
        )
        if s.critic_ppo_micro_batch_size is not None and not s.megatron:  # FSDPCriticConfig.validate only
            run.add(
                s.critic_ppo_micro_batch_size * s.critic_ulysses_sp < W,
                "E17",
                VE,
                f"critic.ppo_micro_batch_size ({s.critic_ppo_micro_batch_size}) * "
                f"ulysses_sequence_parallel_size ({s.critic_ulysses_sp}) must be >= n_gpus ({W})",
                STARTUP,
                f"{CRITIC_PY}: FSDPCriticConfig.validate",
                [
                    f"{s.critic_ppo_micro_batch_size} x {s.critic_ulysses_sp} = {s.critic_ppo_micro_batch_size * s.critic_ulysses_sp} {'<' if s.critic_ppo_micro_batch_size * s.critic_ulysses_sp < W else '>='} {W}"
                ],
                "The deprecated critic micro size must leave at least 1 row per DP rank.",
                role="critic",
            )
