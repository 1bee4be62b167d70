"""The batch-size checks of verl's first training step, per profile, in ``RayPPOTrainer.fit`` order.

Mirrors the agent-loop split (``AgentLoopManager.generate_sequences``), ``RayPPOTrainer._balance_batch``, the
DP dispatch of every worker call, static/dynamic micro-batching (legacy ``dp_actor``/``dp_critic``; engine
``TrainingWorker.train_mini_batch`` + ``prepare_micro_batches``) and the legacy silent behaviours (ragged
mini-batches and their loss weights). Both profiles follow the ``RayPPOTrainer``
(v0) loop when ``trainer.use_v1=false``; under verl 0.9.1's default v1 loop (``trainer/ppo/v1/trainer_base.py:
PPOTrainer._step_once``) the prompts split unevenly over the agent loops (no E26), the batch is padded to a multiple
of lcm(D, M x n, critic M x n) before an always-on balance (no E36/E38), TransferQueue chunks need not be equal
(no E27), so E29 cannot follow a passing E28, while E30 is checked on the padded rows per rank.
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.validate.megatron_checks import legacy_static_forward, legacy_update, pipeline_checks
from labkit.validate.micro_checks import (
    budget_check,
    engine_update_checks,
    legacy_update_checks,
    static_forward_checks,
)
from labkit.validate.snapshot import AE, NOTICE, SILENT, STEP1, Run, Snap, mod

FIT = "verl/trainer/ppo/ray_trainer.py: RayPPOTrainer"
SEQ = "verl/utils/seqlen_balancing.py"
DISPATCH = "verl/single_controller/base/decorator.py: make_nd_compute_dataproto_dispatch_fn"


def _dispatch(run: Run, s: Snap, k: int, stage: str, role: str) -> bool:
    """The nd-dispatch chunk of one worker call: DataProto.chunk (legacy, E26) / chunk_tensordict (engine, E27);
    v1's TransferQueue ``BatchMeta.chunk`` allows uneven chunks (nothing to check)."""
    if s.geo.loop == "v1":
        return False
    if s.legacy:
        return run.add(
            s.samples % k != 0,
            "E26",
            AE,
            message("E26", size=s.samples, chunks=k),
            STEP1,
            f"{DISPATCH} -> verl/protocol.py: DataProto.chunk ({stage})",
            [mod(s.samples, k)],
            f"{stage}: the B x n rows are cut into {k} equal DP chunks without padding.",
            role=role,
        )
    return run.add(
        s.samples % k != 0,
        "E27",
        AE,
        message("E27", size=s.samples, chunks=k),
        STEP1,
        f"{DISPATCH} -> verl/utils/tensordict_utils.py: chunk_tensordict ({stage})",
        [mod(s.samples, k)],
        f"{stage}: the B x n rows are cut into {k} equal DP chunks without padding.",
        role=role,
    )


def _v1_batch(run: Run, s: Snap, D: int) -> None:
    """The v1 loop's dataloader fetches and padding: E47 when gen_batch_size does not divide train_batch_size
    (``PPOTrainer._next_train_batch``), verl's upsampling log line (N6) and the ignored balance flag (S5)."""
    gen = s.gen_batch_size or s.train_batch_size
    run.add(
        s.train_batch_size % gen != 0,
        "E47",
        "ValueError",
        message("E47", num_prompts=s.train_batch_size, gen_batch_size=gen),
        STEP1,
        "verl/trainer/ppo/v1/trainer_base.py: PPOTrainer._next_train_batch",
        [f"data.train_batch_size = {s.train_batch_size}", f"data.gen_batch_size = {gen}", mod(s.train_batch_size, gen)],
        "The v1 loop collects train_batch_size prompts per step from whole dataloader batches of gen_batch_size.",
        role="trainer",
    )
    geo = s.geo
    X, L, pad = geo.generated_samples, geo.required_multiple, geo.padding_rows
    terms = [f"D = {D}"]
    if s.need_critic:
        terms.append(f"critic M x n = {s.critic_ppo_mini_batch_size} x {s.rollout_n}")
    if s.geo.actor_updates:  # the actor updates at this step
        terms.append(f"M x n = {s.ppo_mini_batch_size} x {s.rollout_n}")
    run.add(
        pad > 0,
        "N6",
        None,
        message("N6", rows=X, padded=X + pad, pad=pad, multiple=L),
        STEP1,
        "verl/trainer/ppo/padding_utils.py: upsample_batch_to_divisible_size",
        [
            f"B x n = {s.train_batch_size} x {s.rollout_n} = {X}",
            f"required multiple = lcm({', '.join(terms)}) = {L}",
            f"pad = -{X} % {L} = {pad} synthetic rows of 128 tokens",
            f"rows per DP rank = ({X} + {pad}) / {D} = {(X + pad) // D}",
        ],
        "The v1 loop appends synthetic rows (loss mask 0) so the batch divides by D and by every mini-batch; they "
        "still run through every forward and backward pass.",
        NOTICE,
        role="trainer",
    )
    run.add(
        not s.balance_batch,
        "S5",
        None,
        message("S5"),
        STEP1,
        "verl/trainer/ppo/v1/trainer_base.py: PPOTrainer._step_once",
        ["trainer.balance_batch = false"],
        "The v1 loop never reads trainer.balance_batch (verl issue #7758): it pads and reorders every step.",
        SILENT,
        role="trainer",
    )


def step_checks(run: Run, s: Snap, micro: dict) -> None:
    """Step 1 of RayPPOTrainer.fit: generate, balance, old/ref log-prob, values, critic and actor updates.

    ``micro`` holds the legacy worker's normalised sizes (``Mp``, ``Mcp``, per-role micro sizes); empty for engine.
    """
    Mp, Mcp = micro.get("Mp"), micro.get("Mcp")
    N, W = s.samples, s.world_size
    v1 = s.geo.loop == "v1"
    run.add(
        not v1 and s.geo.agent_loop and N % s.agent_workers != 0,  # v1 chunks the B prompts, unevenly if need be
        "E26",
        AE,
        message("E26", size=N, chunks=s.agent_workers),
        STEP1,
        "verl/experimental/agent_loop/agent_loop.py: AgentLoopManager.generate_sequences",
        [
            f"B x n = {s.prompts} x {s.rollout_n} = {N}",
            f"agent.num_workers = {s.agent_workers}",
            mod(N, s.agent_workers),
        ],
        "The B x n generation requests are chunked equally over the agent-loop workers.",
        role="rollout",
    )
    lay = s.geo.parallel
    if s.megatron:
        if not lay.dp_size:
            return  # megatron-core's mesh already failed at worker init (M7)
        D, sp = lay.trainer_dp_size, lay.token_budget_scale  # budgets x CP
    elif W % s.ulysses_sp:
        return  # the Ulysses mesh already failed at worker init (X4)
    else:
        D, sp = W // s.ulysses_sp, s.ulysses_sp
    if v1:
        _v1_batch(run, s, D)
    if s.balance_batch and not v1:  # v1 pads to a multiple of D first: E36/E38 cannot fire
        where = f"{FIT}._balance_batch -> {SEQ}"
        run.add(
            N < D,
            "E36",
            AE,
            f"number of items:[{N}] < k_partitions:[{D}]",
            STEP1,
            f"{where}: get_seqlen_balanced_partitions",
            [f"{N} < {D}" if N < D else f"{N} >= {D}"],
            "Fewer rows than DP ranks to balance over.",
            role="trainer",
        )
        run.add(
            N >= D and N % D != 0,
            "E38",
            AE,
            f"{N} % {D} != 0",
            STEP1,
            f"{where}: karmarkar_karp",
            [
                f"D = W // (TP x PP x CP) = {W} // {lay.dp_divisor} = {D}"
                if s.megatron
                else f"D = W // sp = {W} // {s.ulysses_sp} = {D}",
                mod(N, D),
            ],
            "_balance_batch partitions B x n rows into D equal-size groups.",
            role="trainer",
        )
    rows = N // D
    if _dispatch(run, s, D, "compute_log_prob", "actor"):
        return  # every later actor-mesh call would fail the same way
    if s.legacy and s.log_prob_use_dynamic_bsz or not s.legacy and s.use_dynamic_bsz:
        budget_check(
            run,
            s,
            "log_prob_max_token_len_per_gpu",
            s.log_prob_max_token_len_per_gpu,
            sp,
            "old_log_prob",
            "rollout",
        )
        if s.megatron:
            pipeline_checks(run, s, None, "old_log_prob", "rollout", False)
    else:
        _static_forward(
            run,
            s,
            rows,
            micro.get("rollout", s.log_prob_micro_batch_size_per_gpu),
            "log_prob_micro_batch_size_per_gpu",
            "old_log_prob",
            "rollout",
        )
    if s.need_ref and (s.legacy or s.megatron or W % s.ref_ulysses_sp == 0):
        Dr = D if s.legacy or s.megatron else W // s.ref_ulysses_sp
        if s.legacy or not _dispatch(run, s, Dr, "compute_ref_log_prob", "ref"):
            if s.ref_log_prob_use_dynamic_bsz:
                budget_check(
                    run,
                    s,
                    "ref.log_prob_max_token_len_per_gpu",
                    s.ref_log_prob_max_token_len_per_gpu,
                    sp if s.megatron else s.ref_ulysses_sp,
                    "ref_log_prob",
                    "ref",
                )
                if s.megatron:
                    pipeline_checks(run, s, None, "ref_log_prob", "ref", False)
            else:
                _static_forward(
                    run,
                    s,
                    -(-N // Dr) if v1 else N // Dr,  # v1: the first TransferQueue chunks are the longer ones
                    micro.get("ref", s.ref_log_prob_micro_batch_size_per_gpu),
                    "ref.log_prob_micro_batch_size_per_gpu",
                    "ref_log_prob",
                    "ref",
                )
    if s.need_critic and s.megatron:
        _megatron_critic_step(run, s, D, Mcp, micro)
    elif s.need_critic and (W % s.critic_ulysses_sp == 0 or not s.legacy):
        _critic_step(run, s, Mcp, micro)
    if not s.geo.actor_updates:
        run.add(
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
    elif s.megatron and s.legacy:
        if Mp is not None:
            if s.use_dynamic_bsz:
                budget_check(
                    run, s, "ppo_max_token_len_per_gpu", s.ppo_max_token_len_per_gpu, sp, "update_actor", "actor"
                )
            legacy_update(run, s, rows, Mp, micro.get("actor"), s.use_dynamic_bsz, "actor")
    elif s.megatron:
        mini = engine_update_checks(
            run, s, s.ppo_mini_batch_size, D, s.ppo_micro_batch_size_per_gpu, s.use_dynamic_bsz, "actor"
        )
        if mini is not None and s.use_dynamic_bsz:
            budget_check(run, s, "ppo_max_token_len_per_gpu", s.ppo_max_token_len_per_gpu, sp, "update_actor", "actor")
            pipeline_checks(run, s, None, "update_actor", "actor", False)
        elif mini is not None and s.ppo_micro_batch_size_per_gpu and mini % s.ppo_micro_batch_size_per_gpu == 0:
            pipeline_checks(run, s, mini // s.ppo_micro_batch_size_per_gpu, "update_actor", "actor", True)
    elif s.legacy:
        if Mp is not None:
            budget = (
                ("ppo_max_token_len_per_gpu", s.ppo_max_token_len_per_gpu, s.ulysses_sp, "update_actor")
                if s.use_dynamic_bsz
                else None
            )
            legacy_update_checks(run, s, rows, Mp, micro.get("actor"), budget, "actor")
    elif (
        engine_update_checks(
            run, s, s.ppo_mini_batch_size, D, s.ppo_micro_batch_size_per_gpu, s.use_dynamic_bsz, "actor"
        )
        is not None
        and s.use_dynamic_bsz
    ):
        budget_check(
            run, s, "ppo_max_token_len_per_gpu", s.ppo_max_token_len_per_gpu, s.ulysses_sp, "update_actor", "actor"
        )


def _critic_step(run: Run, s: Snap, Mcp: int | None, micro: dict) -> None:
    """compute_values then update_critic (legacy CriticWorker/dp_critic; engine TrainingWorker for the critic)."""
    if s.legacy:
        Dc = s.world_size // s.critic_ulysses_sp
        if _dispatch(run, s, Dc, "compute_values", "critic"):
            return
        if s.critic_use_dynamic_bsz:
            budget_check(
                run,
                s,
                "critic.forward_max_token_len_per_gpu",
                s.critic_forward_max_token_len_per_gpu,
                s.critic_ulysses_sp,
                "compute_values",
                "critic",
            )
        else:
            static_forward_checks(
                run,
                s,
                s.samples // Dc,
                micro.get("critic_fwd", s.critic_forward_micro_batch_size_per_gpu),
                "critic.forward_micro_batch_size_per_gpu",
                "compute_values",
                "critic",
            )
        if Mcp is not None:
            budget = (
                (
                    "critic.ppo_max_token_len_per_gpu",
                    s.critic_ppo_max_token_len_per_gpu,
                    s.critic_ulysses_sp,
                    "update_critic",
                )
                if s.critic_use_dynamic_bsz
                else None
            )
            legacy_update_checks(run, s, s.samples // Dc, Mcp, micro.get("critic"), budget, "critic")
        return
    run.add(
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
    if not _dispatch(run, s, s.world_size, "compute_values", "critic"):
        engine_update_checks(run, s, s.critic_ppo_mini_batch_size, s.world_size, None, True, "critic")


def _static_forward(run: Run, s: Snap, rows: int, micro: int | None, key: str, stage: str, role: str) -> None:
    """A static forward-only pass: FSDP's (``static_forward_checks``), or Megatron's: 0.9.1 E30 then the VPP and
    interleaved-schedule checks on rows / m; 0.7.1 ``split(m)`` then the schedule checks."""
    if not s.megatron:
        static_forward_checks(run, s, rows, micro, key, stage, role)
    elif s.legacy:
        legacy_static_forward(run, s, rows, micro, key, stage, role)
    else:
        static_forward_checks(run, s, rows, micro, key, stage, role)
        if micro and rows % micro == 0:
            pipeline_checks(run, s, rows // micro, stage, role, True)


def _megatron_critic_step(run: Run, s: Snap, D: int, Mcp: int | None, micro: dict) -> None:
    """The Megatron critic on the actor's layout: compute_values dispatch, then update_critic (0.7.1: make_iterator
    and micro-batches; 0.9.1: the engine's train_mini_batch, always dynamic since its engine keeps
    use_dynamic_bsz=True)."""
    if _dispatch(run, s, D, "compute_values", "critic"):
        return
    if s.legacy:
        if Mcp is not None:
            legacy_update(run, s, s.samples // D, Mcp, micro.get("critic"), s.critic_use_dynamic_bsz, "critic")
        return
    if engine_update_checks(run, s, s.critic_ppo_mini_batch_size, D, None, True, "critic") is not None:
        pipeline_checks(run, s, None, "update_critic", "critic", False)
