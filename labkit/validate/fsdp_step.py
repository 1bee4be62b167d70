"""The FSDP workers' step-1 rules for the critic and the actor update, per profile: the legacy ``CriticWorker`` /
``dp_critic`` (compute_values then update_critic on its own Ulysses mesh) and ``dp_actor.update_policy``, and 0.9.1's
engine ``TrainingWorker`` for both (the critic's engine is always dynamic, on critic.fsdp's own sp of 1).
``first_step`` lists them in ``RayPPOTrainer.fit`` order; the Megatron backend's are ``megatron_step``.
"""

from __future__ import annotations

from labkit.validate.dispatch import dispatch
from labkit.validate.forward_passes import forward_pass
from labkit.validate.micro_checks import longest_row_budget
from labkit.validate.rulebook import ACTOR_UPDATES, CRITIC, ENGINE, FSDP, LEGACY, When, rule
from labkit.validate.snapshot import NOTICE, STEP1, Recorder, Snap
from labkit.validate.step_state import Pass, StepState
from labkit.validate.update_checks import engine_update_checks, legacy_update_checks

FIT = "verl/trainer/ppo/ray_trainer.py: RayPPOTrainer"
CRITIC_MESH = When("critic mesh built", lambda s: s.world_size % s.critic_ulysses_sp == 0)


@rule("E26 E31 X3 X2 S3 S1 S2", when=LEGACY & FSDP & CRITIC & CRITIC_MESH)
def legacy_critic(rec: Recorder, s: Snap, st: StepState) -> None:
    """compute_values (dispatch, then its forward pass) and update_critic on the critic's own DP mesh."""
    sp = s.critic_ulysses_sp
    Dc = s.world_size // sp
    if dispatch(rec, s, Dc, "compute_values", "critic"):
        return
    rows, dyn = s.samples // Dc, s.critic_use_dynamic_bsz
    values = Pass("compute_values", "critic", rows, dyn, "critic.forward_max_token_len_per_gpu",
                  s.critic_forward_max_token_len_per_gpu, sp, "critic.forward_micro_batch_size_per_gpu",
                  st.micro.get("critic_fwd", s.critic_forward_micro_batch_size_per_gpu))  # fmt: skip
    forward_pass(rec, s, values)
    Mcp = st.micro.get("Mcp")
    if Mcp is not None:
        budget = ("critic.ppo_max_token_len_per_gpu", s.critic_ppo_max_token_len_per_gpu, sp, "update_critic")
        legacy_update_checks(rec, s, rows, Mcp, st.micro.get("critic"), budget if dyn else None, "critic")


@rule("N3 E27 E28 E29", when=ENGINE & FSDP & CRITIC)
def engine_critic(rec: Recorder, s: Snap, st: StepState) -> None:
    """0.9.1 builds the critic's engine from critic.fsdp: dynamic, sp 1, over all W ranks (N3 says what it ignores)."""
    rec.add(
        s.critic_ulysses_sp > 1 or not s.critic_use_dynamic_bsz,
        "N3",
        None,
        "engine critic: micro-batching is dynamic "
        "(EngineConfig.use_dynamic_bsz defaults to True) on critic.fsdp's own Ulysses size (1); "
        "critic.use_dynamic_bsz, critic.*micro_batch_size* and critic.ulysses_sequence_parallel_size are not "
        "passed to it",
        STEP1,
        f"{FIT}.init_workers -> verl/workers/config/critic.py: FSDPCriticConfig",
        [
            f"critic.use_dynamic_bsz = {s.critic_use_dynamic_bsz}",
            f"critic.ulysses_sequence_parallel_size = {s.critic_ulysses_sp}",
        ],
        "verl 0.9.1 builds the critic's engine from critic.fsdp and only copies the token budgets into it.",
        NOTICE,
        role="critic",
    )
    if not dispatch(rec, s, s.world_size, "compute_values", "critic"):
        engine_update_checks(rec, s, s.critic_ppo_mini_batch_size, s.world_size, None, True, "critic")


@rule("X2 E31 S1 S2", when=LEGACY & FSDP & ACTOR_UPDATES)
def legacy_actor_update(rec: Recorder, s: Snap, st: StepState) -> None:
    """dp_actor.update_policy on M' (when worker init normalised it)."""
    Mp = st.micro.get("Mp")
    if Mp is None:
        return
    budget = ("ppo_max_token_len_per_gpu", s.ppo_max_token_len_per_gpu, s.ulysses_sp, "update_actor")
    legacy_update_checks(rec, s, st.rows, Mp, st.micro.get("actor"), budget if s.use_dynamic_bsz else None, "actor")


@rule("E28 E29 E30 E31", when=ENGINE & FSDP & ACTOR_UPDATES)
def engine_actor_update(rec: Recorder, s: Snap, st: StepState) -> None:
    """TrainingWorker.train_mini_batch, then (dynamic) the token budget of the update."""
    m, dyn = s.ppo_micro_batch_size_per_gpu, s.use_dynamic_bsz
    if engine_update_checks(rec, s, s.ppo_mini_batch_size, st.D, m, dyn, "actor") is not None and dyn:
        longest_row_budget(
            rec, s, "ppo_max_token_len_per_gpu", s.ppo_max_token_len_per_gpu, s.ulysses_sp, "update_actor", "actor"
        )
