"""The batch-size checks of verl's first training step, as an ordered list of rules in ``RayPPOTrainer.fit`` order.

Mirrors the agent-loop split (``AgentLoopManager.generate_sequences``), ``RayPPOTrainer._balance_batch``, the
DP dispatch of every worker call (``dispatch``), the forward-only passes (``forward_passes``) and the critic and
actor updates (``fsdp_step``, ``megatron_step``). Both profiles follow the ``RayPPOTrainer`` (v0) loop when
``trainer.use_v1=false``; under verl 0.9.1's default v1 loop (``trainer/ppo/v1/trainer_base.py:
PPOTrainer._step_once``, ``v1_batch``) the prompts split unevenly over the agent loops (no E26), the batch is padded
to a multiple of lcm(D, M x n, critic M x n) before an always-on balance (no E36/E38), TransferQueue chunks need not
be equal (no E27), so E29 cannot follow a passing E28, while E30 is checked on the padded rows per rank.
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.validate.dispatch import dispatch
from labkit.validate.forward_passes import forward_pass
from labkit.validate.fsdp_step import engine_actor_update, engine_critic, legacy_actor_update, legacy_critic
from labkit.validate.megatron_step import (
    engine_megatron_actor_update,
    engine_megatron_critic,
    legacy_megatron_actor_update,
    legacy_megatron_critic,
)
from labkit.validate.rulebook import ACTOR_UPDATES, ENGINE, FSDP, LEGACY, MEGATRON, REF, V1, When, rule, run_rules
from labkit.validate.snapshot import AE, NOTICE, STEP1, Recorder, Snap, mod
from labkit.validate.step_state import Pass, StepState
from labkit.validate.v1_batch import V1_BATCH_RULES

FIT = "verl/trainer/ppo/ray_trainer.py: RayPPOTrainer"
SEQ = "verl/utils/seqlen_balancing.py"
BALANCE = When("balance_batch", lambda s: s.balance_batch)
REF_MESH = When("ref mesh built", lambda s: s.megatron or s.world_size % s.ref_ulysses_sp == 0)


@rule("E26")
def agent_loop_split(rec: Recorder, s: Snap, st: StepState) -> None:
    """The B x n generation requests are chunked equally over the agent-loop workers (v1 chunks the B prompts,
    unevenly if need be)."""
    N, k = s.samples, s.agent_workers
    rec.add(
        s.geo.loop != "v1" and s.geo.agent_loop and N % k != 0,
        "E26",
        AE,
        message("E26", size=N, chunks=k),
        STEP1,
        "verl/experimental/agent_loop/agent_loop.py: AgentLoopManager.generate_sequences",
        [f"B x n = {s.prompts} x {s.rollout_n} = {N}", f"agent.num_workers = {k}", mod(N, k)],
        "The B x n generation requests are chunked equally over the agent-loop workers.",
        role="rollout",
    )


def _set_sizes(s: Snap, st: StepState, D: int, sp: int, ref_dp: int, ref_sp: int) -> None:
    st.D, st.sp, st.rows, st.ref_dp, st.ref_sp = D, sp, s.samples // D, ref_dp, ref_sp


@rule("-", when=MEGATRON)
def megatron_data_parallel(rec: Recorder, s: Snap, st: StepState) -> bool:
    """D = W // (TP x PP x CP) and budgets x CP for every role; stops when megatron-core's mesh failed (M7)."""
    lay = s.geo.parallel
    if not lay.dp_size:
        return True
    _set_sizes(s, st, lay.trainer_dp_size, lay.token_budget_scale, lay.trainer_dp_size, lay.token_budget_scale)
    return False


@rule("-", when=FSDP)
def fsdp_data_parallel(rec: Recorder, s: Snap, st: StepState) -> bool:
    """D = W // sp; stops when the actor's Ulysses mesh failed at worker init (X4)."""
    W, sp = s.world_size, s.ulysses_sp
    if W % sp:
        return True
    _set_sizes(s, st, W // sp, sp, W // sp if s.legacy else W // s.ref_ulysses_sp, s.ref_ulysses_sp)
    return False


def _dp_line(s: Snap, st: StepState) -> str:
    if s.megatron:
        return f"D = W // (TP x PP x CP) = {s.world_size} // {s.geo.parallel.dp_divisor} = {st.D}"
    return f"D = W // sp = {s.world_size} // {s.ulysses_sp} = {st.D}"


@rule("E36", when=~V1 & BALANCE)
def balance_enough_rows(rec: Recorder, s: Snap, st: StepState) -> None:
    """v1 pads to a multiple of D first: E36/E38 cannot fire there."""
    N, D = s.samples, st.D
    rec.add(
        N < D,
        "E36",
        AE,
        f"number of items:[{N}] < k_partitions:[{D}]",
        STEP1,
        f"{FIT}._balance_batch -> {SEQ}: get_seqlen_balanced_partitions",
        [f"{N} < {D}" if N < D else f"{N} >= {D}"],
        "Fewer rows than DP ranks to balance over.",
        role="trainer",
    )


@rule("E38", when=~V1 & BALANCE)
def balance_equal_parts(rec: Recorder, s: Snap, st: StepState) -> None:
    N, D = s.samples, st.D
    rec.add(
        N >= D and N % D != 0,
        "E38",
        AE,
        f"{N} % {D} != 0",
        STEP1,
        f"{FIT}._balance_batch -> {SEQ}: karmarkar_karp",
        [_dp_line(s, st), mod(N, D)],
        "_balance_batch partitions B x n rows into D equal-size groups.",
        role="trainer",
    )


@rule("E26 E27")
def log_prob_dispatch(rec: Recorder, s: Snap, st: StepState) -> bool:
    """compute_log_prob's dispatch; when it raised, every later actor-mesh call would fail the same way: stop."""
    return dispatch(rec, s, st.D, "compute_log_prob", "actor")


def _log_prob_pass(s: Snap, st: StepState, dynamic: bool) -> Pass:
    micro = st.micro.get("rollout", s.log_prob_micro_batch_size_per_gpu)
    return Pass("old_log_prob", "rollout", st.rows, dynamic, "log_prob_max_token_len_per_gpu",
                s.log_prob_max_token_len_per_gpu, st.sp, "log_prob_micro_batch_size_per_gpu", micro)  # fmt: skip


@rule("E31 X3 X2 S3 M21-M25", when=LEGACY)
def legacy_old_log_prob(rec: Recorder, s: Snap, st: StepState) -> None:
    """The old log-probs on the actor's mesh, micro-batched as the rollout's log_prob_use_dynamic_bsz says."""
    forward_pass(rec, s, _log_prob_pass(s, st, s.log_prob_use_dynamic_bsz))


@rule("E31 X3 E30 M21-M23", when=ENGINE)
def engine_old_log_prob(rec: Recorder, s: Snap, st: StepState) -> None:
    """The old log-probs on the actor's engine, micro-batched as the actor's use_dynamic_bsz says (B1: they agree)."""
    forward_pass(rec, s, _log_prob_pass(s, st, s.use_dynamic_bsz))


def _ref_pass(s: Snap, st: StepState) -> Pass:
    Dr = st.ref_dp
    rows = -(-s.samples // Dr) if s.geo.loop == "v1" else s.samples // Dr  # v1: the first chunks are the longer ones
    micro = st.micro.get("ref", s.ref_log_prob_micro_batch_size_per_gpu)
    return Pass("ref_log_prob", "ref", rows, s.ref_log_prob_use_dynamic_bsz, "ref.log_prob_max_token_len_per_gpu",
                s.ref_log_prob_max_token_len_per_gpu, st.ref_sp, "ref.log_prob_micro_batch_size_per_gpu", micro)  # fmt: skip


@rule("E31 X3 X2 S3 M21-M25", when=LEGACY & REF)
def legacy_ref_log_prob(rec: Recorder, s: Snap, st: StepState) -> None:
    """The fused legacy worker computes the ref's log-probs on the actor's mesh (no dispatch of its own)."""
    forward_pass(rec, s, _ref_pass(s, st))


@rule("E27 E31 X3 E30 M21-M23", when=ENGINE & REF & REF_MESH)
def engine_ref_log_prob(rec: Recorder, s: Snap, st: StepState) -> None:
    """The engine's ref: its own dispatch (skips the pass when it raised), then the pass."""
    if not dispatch(rec, s, st.ref_dp, "compute_ref_log_prob", "ref"):
        forward_pass(rec, s, _ref_pass(s, st))


@rule("N4", when=~ACTOR_UPDATES)
def actor_not_updated(rec: Recorder, s: Snap, st: StepState) -> None:
    rec.add(
        True,
        "N4",
        None,
        f"trainer.critic_warmup = {s.critic_warmup}: the actor is not updated at step 1",
        STEP1,
        f"{FIT}.fit",
        [f"critic_warmup {s.critic_warmup} > global_steps 1"],
        f"Actor-update checks run at step {s.critic_warmup}, when global_steps reaches critic_warmup.",
        NOTICE,
        role="actor",
    )


STEP_RULES = (
    agent_loop_split,
    megatron_data_parallel,  # stops when the mesh failed at worker init
    fsdp_data_parallel,
    *V1_BATCH_RULES,
    balance_enough_rows,
    balance_equal_parts,
    log_prob_dispatch,  # stops when it raised
    legacy_old_log_prob,
    engine_old_log_prob,
    legacy_ref_log_prob,
    engine_ref_log_prob,
    legacy_megatron_critic,
    engine_megatron_critic,
    legacy_critic,
    engine_critic,
    actor_not_updated,
    legacy_megatron_actor_update,
    engine_megatron_actor_update,
    legacy_actor_update,
    engine_actor_update,
)
"""Step 1 of RayPPOTrainer.fit: generate, balance, old/ref log-prob, values, critic and actor updates."""


def step_checks(rec: Recorder, s: Snap, micro: dict) -> None:
    """Run the step-1 rules; ``micro`` holds the legacy worker's normalised sizes (``Mp``, ``Mcp``, per-role micro
    sizes), empty for the engine."""
    run_rules(STEP_RULES, rec, s, StepState(micro=micro))
