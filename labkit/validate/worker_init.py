"""verl's worker-init batch-size checks, as an ordered list of rules: the legacy workers' in-place normalisation
(0.7.1/0.8) or the 0.9.1 engine workers' asserts, then the rollout's config and device mesh.

Mirrors ``verl/workers/fsdp_workers.py`` / ``megatron_workers.py: ActorRolloutRefWorker.__init__ /
CriticWorker.__init__ / _build_rollout`` (legacy: ``legacy_workers``, ``megatron_checks``) and
``verl/workers/engine_workers.py: ActorRolloutRefWorker.init_model`` (engine), with the Ulysses mesh and
``apply_monkey_patch`` head asserts (``ulysses_init``); under Megatron the engine's mesh and model checks
(``megatron_checks``) take their place. The rules hand step 1 the legacy normalised sizes (``norm``).
"""

from __future__ import annotations

from labkit.validate.legacy_workers import legacy_actor_heads, legacy_actor_worker, legacy_critic_worker
from labkit.validate.megatron_checks import (
    actor_engine_init,
    critic_layout_notice,
    legacy_megatron_init,
    ref_engine_init,
)
from labkit.validate.micro_pairs import mutual
from labkit.validate.rulebook import ENGINE, LEGACY, REF_ENGINE, STATIC, When, rule, run_rules
from labkit.validate.snapshot import AE, INIT, LEGACY_W, NOTICE, VE, Recorder, Snap, mod
from labkit.validate.ulysses_init import INIT_MODEL, engine_actor_ulysses, engine_ref_ulysses

REF_STATIC = When("ref static", lambda s: not s.ref_log_prob_use_dynamic_bsz)


@rule("N5", when=LEGACY)
def legacy_worker_impl_disabled(rec: Recorder, s: Snap, norm: dict) -> None:
    rec.add(
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


@rule("E7 E6", when=ENGINE & REF_ENGINE & REF_STATIC)
def engine_ref_micro_pair(rec: Recorder, s: Snap, norm: dict) -> None:
    """The ref's log_prob_* keys renamed to ppo_* and re-checked as an ActorConfig (its messages say 'actor')."""
    ref_config = f"{INIT_MODEL} (ref ActorConfig.__post_init__)"
    dep, per_gpu = s.ref_log_prob_micro_batch_size, s.ref_log_prob_micro_batch_size_per_gpu
    mutual(rec, "ref", dep, per_gpu, ref_config, "actor", "ref", INIT)
    for f in rec.checks[-2:]:
        f.explanation = (
            "The ref's log_prob_* keys are renamed to ppo_* and re-checked as an ActorConfig (its "
            "messages say 'actor'): " + f.explanation
        )


@rule("B1", when=ENGINE)
def log_prob_dynamic_agrees(rec: Recorder, s: Snap, norm: dict) -> None:
    rec.add(
        s.use_dynamic_bsz != s.log_prob_use_dynamic_bsz,
        "B1",
        AE,
        "",
        INIT,
        INIT_MODEL,
        [
            f"actor.use_dynamic_bsz = {s.use_dynamic_bsz}",
            f"rollout.log_prob_use_dynamic_bsz = {s.log_prob_use_dynamic_bsz}",
        ],
        "Bare assert: the actor and rollout log-prob use_dynamic_bsz must agree on the engine path.",
        role="rollout",
    )


@rule("B2", when=ENGINE & STATIC)
def log_prob_micro_per_gpu_set(rec: Recorder, s: Snap, norm: dict) -> None:
    rec.add(
        s.log_prob_micro_batch_size_per_gpu is None,
        "B2",
        AE,
        "",
        INIT,
        INIT_MODEL,
        [f"rollout.log_prob_micro_batch_size_per_gpu = {s.log_prob_micro_batch_size_per_gpu}"],
        "Bare assert: the engine reads only the *_per_gpu log-prob key; the deprecated global one is unusable.",
        role="rollout",
    )


@rule("B3", when=ENGINE & STATIC)
def actor_micro_per_gpu_set(rec: Recorder, s: Snap, norm: dict) -> None:
    rec.add(
        s.ppo_micro_batch_size_per_gpu is None,
        "B3",
        AE,
        "",
        INIT,
        INIT_MODEL,
        [f"actor.ppo_micro_batch_size_per_gpu = {s.ppo_micro_batch_size_per_gpu}"],
        "Bare assert: the engine reads only actor.ppo_micro_batch_size_per_gpu; the deprecated global "
        "ppo_micro_batch_size is unusable.",
        role="actor",
    )


@rule("E25")
def rollout_mode(rec: Recorder, s: Snap, norm: dict) -> None:
    """RolloutConfig.__post_init__, when the worker builds its rollout."""
    rec.add(
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


def _build_rollout(s: Snap) -> str:
    """Where the worker asserts the rollout's device mesh."""
    if not s.legacy:
        return INIT_MODEL
    return f"{'verl/workers/megatron_workers.py' if s.megatron else LEGACY_W}: ActorRolloutRefWorker._build_rollout"


@rule("E23")
def rollout_mesh(rec: Recorder, s: Snap, norm: dict) -> None:
    """The rollout device mesh: every replica needs tp x dp x pp whole GPUs."""
    iw = s.rollout_tp * s.rollout_dp * s.rollout_pp
    rec.add(
        s.world_size % iw != 0,
        "E23",
        AE,
        f"rollout world_size: {s.world_size} is not divisible by infer_world_size: {iw}",
        INIT,
        _build_rollout(s),
        [
            f"infer_world_size = tp x dp x pp = {s.rollout_tp} x {s.rollout_dp} x {s.rollout_pp} = {iw}",
            mod(s.world_size, iw),
        ],
        "Every rollout replica needs tp x dp x pp whole GPUs.",
        role="rollout",
    )


WORKER_RULES = (
    legacy_worker_impl_disabled,
    legacy_megatron_init,  # 0.7.1 megatron_workers.py; stops when nothing was normalised
    legacy_actor_worker,
    legacy_critic_worker,
    legacy_actor_heads,
    engine_ref_micro_pair,
    ref_engine_init,  # Megatron: the ref's engine fixes the process's layout; stops when it raised
    engine_ref_ulysses,
    log_prob_dynamic_agrees,
    log_prob_micro_per_gpu_set,
    actor_micro_per_gpu_set,
    actor_engine_init,  # Megatron without a ref engine; stops when it raised
    critic_layout_notice,
    engine_actor_ulysses,
    rollout_mode,
    rollout_mesh,
)
"""Worker construction and init_model, per profile and engine, in verl's order."""


def worker_checks(rec: Recorder, s: Snap) -> dict:
    """Run the worker-init rules; returns the legacy normalised sizes (``Mp``, ``Mcp``, per-role micro sizes) that
    step 1 runs with (empty for the engine workers, and when verl stopped before normalising)."""
    norm: dict = {}
    run_rules(WORKER_RULES, rec, s, norm)
    return norm
