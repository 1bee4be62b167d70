"""verl's worker-init batch-size checks: legacy in-worker normalisation (0.7.1/0.8) and the 0.9.1 engine asserts.

Mirrors ``verl/workers/fsdp_workers.py: ActorRolloutRefWorker.__init__ / CriticWorker.__init__ / _build_rollout``
(legacy) and ``verl/workers/engine_workers.py: ActorRolloutRefWorker.init_model`` (engine), plus the Ulysses
mesh and ``apply_monkey_patch`` head asserts, in the order the workers run them; under Megatron the engine's mesh
and model checks (``labkit.validate.megatron_checks``) take the place of the Ulysses ones.
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.rules.geometry import legacy_normalized_mini
from labkit.validate.megatron_checks import engine_init, layout_notice, legacy_init
from labkit.validate.snapshot import AE, ENGINE_W, INIT, LEGACY_W, NOTICE, RF, SILENT, VE, R, Run, Snap, mod
from labkit.validate.startup import mutual


def mesh_check(run: Run, s: Snap, sp: int, where: str, role: str) -> bool:
    """X4: the Ulysses (dp, sp) device mesh needs W % sp == 0; returns True when it fails."""
    return run.add(
        sp > 1 and s.world_size % sp != 0,
        "X4",
        "RuntimeError",
        f"torch init_device_mesh(mesh_shape=({s.world_size // sp}, {sp}), mesh_dim_names=['dp', 'sp']) cannot cover "
        f"a world of {s.world_size} ranks (exact text depends on the torch version)",
        INIT,
        where,
        [mod(s.world_size, sp)] if sp > 1 else [f"sp = {sp}: no Ulysses mesh"],
        f"The {role} Ulysses mesh is (W // sp, sp); W must be a multiple of sp.",
        role=role,
    )


def heads_check(run: Run, s: Snap, sp: int, role: str) -> None:
    """E41/E42: mirrors verl/models/transformers/monkey_patch.py: apply_monkey_patch head asserts."""
    if s.heads is None and s.kv_heads is None:
        return
    where = "verl/models/transformers/monkey_patch.py: apply_monkey_patch"
    if s.heads is not None:
        run.add(
            s.heads % sp != 0,
            "E41",
            AE,
            f"num_attention_heads {s.heads} must be divisible by ulysses_sp_size {sp}",
            INIT,
            where,
            [mod(s.heads, sp)],
            "Ulysses scatters attention heads over the sp ranks.",
            role=role,
        )
    if s.kv_heads is not None:
        kv = s.kv_heads
        bad = kv % sp != 0 and sp % kv != 0
        run.add(
            bad,
            "E42",
            AE,
            f"num_key_value_heads {kv} must be divisible by ulysses_sp_size {sp}or vise versa. "
            "Upon ulysses_sp_size % num_key_value_heads == 0,kv heads are repeated to ensure correctness.",
            INIT,
            where,
            [mod(kv, sp), mod(sp, kv)],
            "KV heads are split over sp, or repeated when sp is a multiple.",
            role=role,
        )


def _legacy_normalize(run: Run, s: Snap, role: str) -> tuple[int | None, int | None]:
    """Legacy in-worker normalisation (ActorRolloutRefWorker/CriticWorker.__init__): returns (M', micro per GPU)."""
    actor = role == "actor"
    sp, M, u, m = (
        (s.ulysses_sp, s.ppo_mini_batch_size, s.ppo_micro_batch_size, s.ppo_micro_batch_size_per_gpu)
        if actor
        else (
            s.critic_ulysses_sp,
            s.critic_ppo_mini_batch_size,
            s.critic_ppo_micro_batch_size,
            s.critic_ppo_micro_batch_size_per_gpu,
        )
    )
    where = f"{LEGACY_W}: {'ActorRolloutRefWorker' if actor else 'CriticWorker'}.__init__"
    sec = "actor_rollout_ref.actor" if actor else "critic"
    D = s.world_size // sp
    Mp = legacy_normalized_mini(M, s.rollout_n, s.world_size, sp)
    norm = f"M' = ({M} x {s.rollout_n}) // ({s.world_size} // {sp}) = {Mp}"
    if actor and run.add(
        Mp <= 0,
        "E20",
        AE,
        message("E20", mini=Mp),
        INIT,
        where,
        [norm],
        f"The mini-batch M x n = {M * s.rollout_n} is smaller than the DP size {D}; the floor gives 0.",
        role=role,
    ):
        return None, None  # nothing after this assert runs; E21/E22 would only restate it
    if u is not None:
        m = u // D
        run.add(
            True,
            "S4",
            None,
            f"{sec}.ppo_micro_batch_size {u} is floor-divided to {m} per GPU",
            INIT,
            where,
            [f"{u} // ({s.world_size} // {sp}) = {m}"],
            "The deprecated global micro size is divided by the DP size and copied into ppo_micro_batch_size_per_gpu.",
            SILENT,
            role=role,
        )
        if not actor and run.add(
            s.critic_forward_micro_batch_size is None,
            "X8",
            "TypeError",
            message("X8"),
            INIT,
            where,
            [f"critic.ppo_micro_batch_size = {u}", "critic.forward_micro_batch_size = None", f"None //= {D}"],
            "The worker divides both global critic micro sizes by the DP size in place; the forward one is null.",
            role=role,
        ):
            return None, None  # the worker's __init__ stops here
    if m is None:
        return Mp, None
    if run.add(
        m == 0,
        "X1",
        "ZeroDivisionError",
        "integer modulo by zero",
        INIT,
        where,
        [norm, f"{Mp} % 0"],
        "The deprecated micro size floor-divided to 0 per GPU; the divisibility assert then divides by 0.",
        role=role,
    ):
        return Mp, m
    if run.add(
        Mp % m != 0,
        "E21",
        AE,
        message("E21", mini=Mp, micro=m),
        INIT,
        where,
        [norm, mod(Mp, m)],
        f"The per-rank mini-batch M' must be a whole number of micro-batches of {m} (checked even with "
        "use_dynamic_bsz).",
        role=role,
    ):
        return Mp, m  # the next assert (E22) is not reached
    run.add(
        Mp // m == 0,
        "E22",
        AE,
        message("E22", mini=Mp, micro=m),
        INIT,
        where,
        [norm, f"{Mp} // {m} = {Mp // m}"],
        "The normalised mini-batch is smaller than one micro-batch.",
        role=role,
    )
    if Mp // m > 0:
        run.add(
            False,
            "GA",
            None,
            "",
            INIT,
            where,
            [f"GA = {Mp} // {m} = {Mp // m}"],
            "Gradient accumulation steps per mini-batch (static micro-batching).",
            role=role,
        )
    return Mp, m


def _rollout_init(run: Run, s: Snap, where: str) -> None:
    """RolloutConfig.__post_init__ (E25) then the rollout device mesh assert (E23)."""
    run.add(
        s.rollout_mode == "sync",
        "E25",
        VE,
        "Rollout mode 'sync' has been removed. Please set "
        "`actor_rollout_ref.rollout.mode=async` or remove the mode setting entirely.",
        INIT,
        "verl/workers/config/rollout.py: RolloutConfig.__post_init__",
        [f"rollout.mode = {s.rollout_mode}"],
        "Only the async (agent-loop) rollout exists.",
        role="rollout",
    )
    iw = s.rollout_tp * s.rollout_dp * s.rollout_pp
    run.add(
        s.world_size % iw != 0,
        "E23",
        AE,
        f"rollout world_size: {s.world_size} is not divisible by infer_world_size: {iw}",
        INIT,
        where,
        [
            f"infer_world_size = tp x dp x pp = {s.rollout_tp} x {s.rollout_dp} x {s.rollout_pp} = {iw}",
            mod(s.world_size, iw),
        ],
        "Every rollout replica needs tp x dp x pp whole GPUs.",
        role="rollout",
    )


def worker_checks(run: Run, s: Snap) -> dict:
    """Worker construction and init_model, per profile, in verl's order; returns the legacy normalised sizes."""
    norm: dict = {}
    if s.legacy:
        run.add(
            s.use_legacy_worker_impl == "disable",
            "N5",
            None,
            "trainer.use_legacy_worker_impl=disable: verl 0.7.1 runs the "
            "engine workers, not the legacy ones this profile models",
            INIT,
            "verl/trainer/main_ppo.py: TaskRunner",
            ["trainer.use_legacy_worker_impl = disable"],
            "Use profile 'engine' for the worker and step-1 checks; the start-up checks above are 0.7.1's either way.",
            NOTICE,
            role="trainer",
        )
        if s.megatron:  # verl 0.7.1's megatron_workers.py
            norm = legacy_init(run, s)
            if norm:
                _rollout_init(run, s, "verl/workers/megatron_workers.py: ActorRolloutRefWorker._build_rollout")
            return norm
        where = f"{LEGACY_W}: ActorRolloutRefWorker.__init__"
        if not mesh_check(run, s, s.ulysses_sp, where, "actor"):
            D = s.world_size // s.ulysses_sp
            norm["Mp"], norm["actor"] = _legacy_normalize(run, s, "actor")
            for sec, u, m, role in (
                (R, s.log_prob_micro_batch_size, s.log_prob_micro_batch_size_per_gpu, "rollout"),
                (RF, s.ref_log_prob_micro_batch_size, s.ref_log_prob_micro_batch_size_per_gpu, "ref"),
            ):
                norm[role] = m if u is None else u // D
                if u is not None and (role == "rollout" or s.need_ref):
                    run.add(
                        True,
                        "S4",
                        None,
                        f"{sec}.log_prob_micro_batch_size {u} is floor-divided to {u // D} per GPU",
                        INIT,
                        where,
                        [f"{u} // ({s.world_size} // {s.ulysses_sp}) = {u // D}"],
                        "The deprecated global log-prob micro size is "
                        "divided by the DP size; *_per_gpu keys are never divided.",
                        SILENT,
                        role=role,
                    )
        if s.need_critic and not mesh_check(
            run, s, s.critic_ulysses_sp, f"{LEGACY_W}: CriticWorker.__init__", "critic"
        ):
            norm["Mcp"], norm["critic"] = _legacy_normalize(run, s, "critic")
            Dc = s.world_size // s.critic_ulysses_sp
            norm["critic_fwd"] = (
                s.critic_forward_micro_batch_size_per_gpu
                if s.critic_ppo_micro_batch_size is None or s.critic_forward_micro_batch_size is None
                else s.critic_forward_micro_batch_size // Dc
            )
            heads_check(run, s, s.critic_ulysses_sp, "critic")
        heads_check(run, s, s.ulysses_sp, "actor")
        _rollout_init(run, s, f"{LEGACY_W}: ActorRolloutRefWorker._build_rollout")
        return norm
    where = f"{ENGINE_W}: ActorRolloutRefWorker.init_model"
    if s.need_ref and not s.lora_rank and not s.ref_log_prob_use_dynamic_bsz:
        mutual(
            run,
            "ref",
            s.ref_log_prob_micro_batch_size,
            s.ref_log_prob_micro_batch_size_per_gpu,
            f"{where} (ref ActorConfig.__post_init__)",
            "actor",
            "ref",
            INIT,
        )
        for f in run.checks[-2:]:
            f.explanation = (
                "The ref's log_prob_* keys are renamed to ppo_* and re-checked as an ActorConfig (its "
                "messages say 'actor'): " + f.explanation
            )
    ref_first = s.need_ref and not s.lora_rank
    if s.megatron:  # the ref's MegatronEngine is built first and fixes the layout of the process
        if ref_first and engine_init(run, s, "ref"):
            return norm
    elif ref_first and not mesh_check(run, s, s.ref_ulysses_sp, where, "ref"):
        heads_check(run, s, s.ref_ulysses_sp, "ref")
    run.add(
        s.use_dynamic_bsz != s.log_prob_use_dynamic_bsz,
        "B1",
        AE,
        "",
        INIT,
        where,
        [
            f"actor.use_dynamic_bsz = {s.use_dynamic_bsz}",
            f"rollout.log_prob_use_dynamic_bsz = {s.log_prob_use_dynamic_bsz}",
        ],
        "Bare assert: the actor and rollout log-prob use_dynamic_bsz must agree on the engine path.",
        role="rollout",
    )
    if not s.use_dynamic_bsz:
        run.add(
            s.log_prob_micro_batch_size_per_gpu is None,
            "B2",
            AE,
            "",
            INIT,
            where,
            [f"rollout.log_prob_micro_batch_size_per_gpu = {s.log_prob_micro_batch_size_per_gpu}"],
            "Bare assert: the engine reads only the *_per_gpu log-prob key; the deprecated global one is unusable.",
            role="rollout",
        )
        run.add(
            s.ppo_micro_batch_size_per_gpu is None,
            "B3",
            AE,
            "",
            INIT,
            where,
            [f"actor.ppo_micro_batch_size_per_gpu = {s.ppo_micro_batch_size_per_gpu}"],
            "Bare assert: the engine reads only actor.ppo_micro_batch_size_per_gpu; the deprecated global "
            "ppo_micro_batch_size is unusable.",
            role="actor",
        )
    if s.megatron:
        if not ref_first and engine_init(run, s, "actor"):
            return norm
        if s.need_critic:
            layout_notice(run, s, "critic")
    elif not mesh_check(run, s, s.ulysses_sp, where, "actor"):
        heads_check(run, s, s.ulysses_sp, "actor")
    _rollout_init(run, s, where)
    return norm
