"""verl 0.7.1's FSDP workers at init, as rules: ``ActorRolloutRefWorker.__init__`` and ``CriticWorker.__init__`` of
``verl/workers/fsdp_workers.py`` build the Ulysses mesh, then normalise the mini- and micro-batch sizes in place
(``*= n; //= DP``) and assert on the result (E20-E22, X1, X8). The normalised sizes are what step 1 runs with:
each rule writes them into the stage's ``norm`` (``Mp``, ``Mcp`` and the per-role micro sizes).
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.rules.geometry import legacy_normalized_mini
from labkit.validate.rulebook import CRITIC, FSDP, LEGACY, rule
from labkit.validate.snapshot import AE, INIT, LEGACY_W, RF, SILENT, R, Recorder, Snap, mod
from labkit.validate.ulysses_init import heads_check, mesh_check

ACTOR_INIT, CRITIC_INIT = f"{LEGACY_W}: ActorRolloutRefWorker.__init__", f"{LEGACY_W}: CriticWorker.__init__"


def _sizes(s: Snap, role: str) -> tuple[int, int, int | None, int | None]:
    """(sp, M, deprecated micro, micro per GPU) of the actor or the critic."""
    if role == "actor":
        return s.ulysses_sp, s.ppo_mini_batch_size, s.ppo_micro_batch_size, s.ppo_micro_batch_size_per_gpu
    return (
        s.critic_ulysses_sp,
        s.critic_ppo_mini_batch_size,
        s.critic_ppo_micro_batch_size,
        s.critic_ppo_micro_batch_size_per_gpu,
    )


def normalise(rec: Recorder, s: Snap, role: str) -> tuple[int | None, int | None]:
    """The in-worker normalisation of the actor or the critic and its asserts, in the worker's order; returns
    (M', micro per GPU), (None, None) when an assert stopped the worker before the sizes exist."""
    actor = role == "actor"
    sp, M, u, m = _sizes(s, role)
    where = ACTOR_INIT if actor else CRITIC_INIT
    sec = "actor_rollout_ref.actor" if actor else "critic"
    D = s.world_size // sp
    Mp = legacy_normalized_mini(M, s.rollout_n, s.world_size, sp)
    norm = f"M' = ({M} x {s.rollout_n}) // ({s.world_size} // {sp}) = {Mp}"
    if actor and rec.add(
        Mp <= 0, "E20", AE, message("E20", mini=Mp), INIT, where, [norm],
        f"The mini-batch M x n = {M * s.rollout_n} is smaller than the DP size {D}; the floor gives 0.", role=role,
    ):  # fmt: skip
        return None, None  # nothing after this assert runs; E21/E22 would only restate it
    if u is not None:
        m = u // D
        rec.add(
            True, "S4", None, f"{sec}.ppo_micro_batch_size {u} is floor-divided to {m} per GPU", INIT, where,
            [f"{u} // ({s.world_size} // {sp}) = {m}"],
            "The deprecated global micro size is divided by the DP size and copied into ppo_micro_batch_size_per_gpu.",
            SILENT, role=role,
        )  # fmt: skip
        if not actor and rec.add(
            s.critic_forward_micro_batch_size is None, "X8", "TypeError", message("X8"), INIT, where,
            [f"critic.ppo_micro_batch_size = {u}", "critic.forward_micro_batch_size = None", f"None //= {D}"],
            "The worker divides both global critic micro sizes by the DP size in place; the forward one is null.",
            role=role,
        ):  # fmt: skip
            return None, None  # the worker's __init__ stops here
    if m is None:
        return Mp, None
    if rec.add(
        m == 0, "X1", "ZeroDivisionError", "integer modulo by zero", INIT, where, [norm, f"{Mp} % 0"],
        "The deprecated micro size floor-divided to 0 per GPU; the divisibility assert then divides by 0.", role=role,
    ):  # fmt: skip
        return Mp, m
    if rec.add(
        Mp % m != 0, "E21", AE, message("E21", mini=Mp, micro=m), INIT, where, [norm, mod(Mp, m)],
        f"The per-rank mini-batch M' must be a whole number of micro-batches of {m} (checked even with "
        "use_dynamic_bsz).", role=role,
    ):  # fmt: skip
        return Mp, m  # the next assert (E22) is not reached
    rec.add(
        Mp // m == 0, "E22", AE, message("E22", mini=Mp, micro=m), INIT, where, [norm, f"{Mp} // {m} = {Mp // m}"],
        "The normalised mini-batch is smaller than one micro-batch.", role=role,
    )  # fmt: skip
    if Mp // m > 0:
        rec.add(
            False, "GA", None, "", INIT, where, [f"GA = {Mp} // {m} = {Mp // m}"],
            "Gradient accumulation steps per mini-batch (static micro-batching).", role=role,
        )  # fmt: skip
    return Mp, m


@rule("X4 E20 S4 X1 E21 E22 GA", when=LEGACY & FSDP)
def legacy_actor_worker(rec: Recorder, s: Snap, norm: dict) -> None:
    """ActorRolloutRefWorker.__init__: the Ulysses mesh, then (when it is built) the actor's normalisation and the
    log-prob micro sizes divided by DP (``*_per_gpu`` keys are never divided)."""
    if mesh_check(rec, s, s.ulysses_sp, ACTOR_INIT, "actor"):
        return
    D = s.world_size // s.ulysses_sp
    norm["Mp"], norm["actor"] = normalise(rec, s, "actor")
    for sec, u, m, role in (
        (R, s.log_prob_micro_batch_size, s.log_prob_micro_batch_size_per_gpu, "rollout"),
        (RF, s.ref_log_prob_micro_batch_size, s.ref_log_prob_micro_batch_size_per_gpu, "ref"),
    ):
        norm[role] = m if u is None else u // D
        if u is not None and (role == "rollout" or s.need_ref):
            rec.add(
                True, "S4", None, f"{sec}.log_prob_micro_batch_size {u} is floor-divided to {u // D} per GPU", INIT,
                ACTOR_INIT, [f"{u} // ({s.world_size} // {s.ulysses_sp}) = {u // D}"],
                "The deprecated global log-prob micro size is divided by the DP size; *_per_gpu keys are never "
                "divided.", SILENT, role=role,
            )  # fmt: skip


@rule("X4 E20-E22 S4 X8 X1 GA E41 E42", when=LEGACY & FSDP & CRITIC)
def legacy_critic_worker(rec: Recorder, s: Snap, norm: dict) -> None:
    """CriticWorker.__init__: its Ulysses mesh, then (when it is built) the critic's normalisation, its forward
    micro size and its heads."""
    if mesh_check(rec, s, s.critic_ulysses_sp, CRITIC_INIT, "critic"):
        return
    norm["Mcp"], norm["critic"] = normalise(rec, s, "critic")
    Dc = s.world_size // s.critic_ulysses_sp
    norm["critic_fwd"] = (
        s.critic_forward_micro_batch_size_per_gpu
        if s.critic_ppo_micro_batch_size is None or s.critic_forward_micro_batch_size is None
        else s.critic_forward_micro_batch_size // Dc
    )
    heads_check(rec, s, s.critic_ulysses_sp, "critic")


@rule("E41 E42", when=LEGACY & FSDP)
def legacy_actor_heads(rec: Recorder, s: Snap, norm: dict) -> None:
    """apply_monkey_patch in the actor's init_model (recorded even when the actor's mesh failed)."""
    heads_check(rec, s, s.ulysses_sp, "actor")
