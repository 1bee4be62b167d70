"""The Megatron backend's step-1 rules: the micro-batch count of every pass against the virtual pipeline (verl's
M21 and megatron-core's interleaved schedule, M22/M23), 0.7.1's forward and update passes (M25, ``make_iterator``:
X1, E29) and the critic and actor updates on the actor's layout, per profile. Mirrors
``transformer_impl.py: MegatronEngine.forward_backward_batch`` (0.9.1) and ``megatron_actor.py`` (0.7.1);
the schedule arithmetic is ``labkit.rules.megatron_schedule``.
"""

from __future__ import annotations

from labkit.rules import megatron_schedule as ms
from labkit.rules.catalogue import message
from labkit.validate.dispatch import dispatch
from labkit.validate.megatron_verdicts import IMPL, WHERE, WHY, add_verdict, megatron_key
from labkit.validate.micro_checks import Split, longest_row_budget, padded_width_budget
from labkit.validate.rulebook import ACTOR_UPDATES, CRITIC, ENGINE, LEGACY, MEGATRON, rule
from labkit.validate.snapshot import AE, SILENT, STEP1, Recorder, Snap, mod
from labkit.validate.step_state import Pass, StepState
from labkit.validate.update_checks import engine_update_checks

VPP_STATIC = "verl's static micro-batching is not rounded to G under VPP: rows / m must be a multiple of G."
VPP_DYNAMIC = " Dynamic micro-batch counts are rounded up to a multiple of G, so only G < PP is certain."


def pipeline_checks(rec: Recorder, s: Snap, count: int | None, stage: str, role: str, static: bool) -> bool:
    """The micro-batch count of one pass against VPP: verl's assert (M21; 0.9.1 static and dynamic, 0.7.1 dynamic;
    a dynamic count is rounded up to G so it cannot fire) and megatron-core's interleaved checks (M22, M23)."""
    lay = s.geo.parallel
    g = megatron_key(s, "override_transformer_config.microbatch_group_size_per_vp_stage")
    div = ms.num_batches_divided_by(lay.pp, lay.vpp, g)
    where = (
        f"{IMPL}.forward_backward_batch ({stage})"
        if not s.legacy
        else f"verl/workers/actor/megatron_actor.py: MegatronPPOActor.forward_backward_batch ({stage})"
    )
    if static and count is not None and not s.legacy:
        if add_verdict(rec, ms.vpp_micro_batch_check(count, div, s.profile), STEP1, role, where, VPP_STATIC):
            return True
    if count is None:  # dynamic: the count is a multiple of G when VPP > 1; only G < PP is certain
        v = ms.dynamic_group_check(lay.pp, lay.vpp, g)
        return v is not None and add_verdict(rec, v, STEP1, role, f"{WHERE['M22']} ({stage})", WHY["M22"] + VPP_DYNAMIC)
    verdicts = ms.interleaved_schedule_checks(count, lay.pp, lay.vpp, g)
    return any(add_verdict(rec, v, STEP1, role, f"{WHERE[v.code]} ({stage})") for v in verdicts)


def legacy_static_forward(
    rec: Recorder, s: Snap, rows: int, micro: int | None, key: str, stage: str, role: str
) -> None:
    """0.7.1 static forward-only pass: asserts the micro size is set (M25), ``split(m)`` (ragged allowed), then the
    pipeline checks on ceil(rows / m)."""
    where = f"verl/workers/actor/megatron_actor.py: MegatronPPOActor.compute_log_prob ({stage})"
    if rec.add(micro is None, "M25", AE, message("M25"), STEP1, where, [f"{key} = None"],
               "The legacy Megatron worker copies a deprecated log-prob micro size into *_per_gpu only when the actor's "
               "deprecated ppo_micro_batch_size is set; nothing reaches this pass.", role=role):  # fmt: skip
        return
    count = ms.static_micro_batches(rows, micro)
    sizes = Split(rows, micro).describe()
    rec.add(rows % micro != 0, "S3", None, message("S3", stage=stage, rows=rows, sizes=sizes), STEP1,
            where, [f"ceil({rows} / {micro}) = {count} micro-batches"],
            "split(m) allows a short last micro-batch.", SILENT, role=role)  # fmt: skip
    pipeline_checks(rec, s, count, stage, role, True)


def legacy_update(rec: Recorder, s: Snap, rows: int, Mp: int, micro: int | None, dyn: bool, role: str) -> None:
    """0.7.1 update_policy / update_critic: ``DataProto.make_iterator(M')`` (X1 when M' = 0, E29 when it does not
    divide the rows), then the micro-batches of one mini-batch (``split(m)`` or the token budget x CP)."""
    where = "verl/protocol.py: DataProto.make_iterator"
    if rec.add(Mp == 0, "X1", "ZeroDivisionError", "integer modulo by zero", STEP1, where,
               [f"M' = ({'critic ' if role == 'critic' else ''}M x n) // DP = {Mp}"],
               "The normalised mini-batch floors to 0 (M x n < DP) and make_iterator divides by it.", role=role):  # fmt: skip
        return
    if rec.add(rows % Mp != 0, "E29", AE, message("E29", rows=rows, mini=Mp), STEP1, where,
               [f"rows per rank = {rows}", f"M' = {Mp}", mod(rows, Mp)],
               "Each rank's rows must be a whole number of mini-batches (DataProto.make_iterator).", role=role):  # fmt: skip
        return
    if dyn:
        pipeline_checks(rec, s, None, f"update_{role}", role, False)
    elif micro:
        pipeline_checks(rec, s, ms.static_micro_batches(Mp, micro), f"update_{role}", role, True)


# -- the forward-only passes (``forward_passes`` lists them) ----------------------------------------------------------
@rule("M22", when=MEGATRON)
def dynamic_pipeline(rec: Recorder, s: Snap, p: Pass) -> None:
    """A dynamic pass's micro-batch count is rounded up to G: only G < PP is certain."""
    pipeline_checks(rec, s, None, p.stage, p.role, False)


@rule("M21 M22 M23", when=ENGINE & MEGATRON)
def engine_static_pipeline(rec: Recorder, s: Snap, p: Pass) -> None:
    """0.9.1 static pass: after E30, the VPP and interleaved-schedule checks on rows / m."""
    if p.micro and p.rows % p.micro == 0:
        pipeline_checks(rec, s, p.rows // p.micro, p.stage, p.role, True)


@rule("M25 S3 M21-M23", when=LEGACY & MEGATRON)
def legacy_megatron_forward(rec: Recorder, s: Snap, p: Pass) -> None:
    legacy_static_forward(rec, s, p.rows, p.micro, p.micro_key, p.stage, p.role)


# -- step 1 (``first_step`` lists them) -------------------------------------------------------------------------------
@rule("E26 X1 E29 M21-M23", when=LEGACY & MEGATRON & CRITIC)
def legacy_megatron_critic(rec: Recorder, s: Snap, st: StepState) -> None:
    """0.7.1 compute_values dispatch, then update_critic (make_iterator and its micro-batches)."""
    if dispatch(rec, s, st.D, "compute_values", "critic"):
        return
    Mcp = st.micro.get("Mcp")
    if Mcp is not None:
        legacy_update(rec, s, s.samples // st.D, Mcp, st.micro.get("critic"), s.critic_use_dynamic_bsz, "critic")


@rule("E27 E28 E29 M22", when=ENGINE & MEGATRON & CRITIC)
def engine_megatron_critic(rec: Recorder, s: Snap, st: StepState) -> None:
    """0.9.1 compute_values dispatch, then the engine's train_mini_batch, always dynamic (its engine keeps
    use_dynamic_bsz=True)."""
    if dispatch(rec, s, st.D, "compute_values", "critic"):
        return
    if engine_update_checks(rec, s, s.critic_ppo_mini_batch_size, st.D, None, True, "critic") is not None:
        pipeline_checks(rec, s, None, "update_critic", "critic", False)


@rule("E31 X1 E29 M21-M23", when=LEGACY & MEGATRON & ACTOR_UPDATES)
def legacy_megatron_actor_update(rec: Recorder, s: Snap, st: StepState) -> None:
    """0.7.1 update_policy on M' (when worker init normalised it): the token budget x CP, then make_iterator."""
    Mp = st.micro.get("Mp")
    if Mp is None:
        return
    if s.use_dynamic_bsz:
        padded_width_budget(
            rec, s, "ppo_max_token_len_per_gpu", s.ppo_max_token_len_per_gpu, st.sp, "update_actor", "actor"
        )
    legacy_update(rec, s, st.rows, Mp, st.micro.get("actor"), s.use_dynamic_bsz, "actor")


@rule("E28 E29 E30 E31 M21-M23", when=ENGINE & MEGATRON & ACTOR_UPDATES)
def engine_megatron_actor_update(rec: Recorder, s: Snap, st: StepState) -> None:
    """0.9.1 train_mini_batch, then the token budget x CP and the dynamic group check, or the static count's."""
    m = s.ppo_micro_batch_size_per_gpu
    mini = engine_update_checks(rec, s, s.ppo_mini_batch_size, st.D, m, s.use_dynamic_bsz, "actor")
    if mini is not None and s.use_dynamic_bsz:
        longest_row_budget(
            rec, s, "ppo_max_token_len_per_gpu", s.ppo_max_token_len_per_gpu, st.sp, "update_actor", "actor"
        )
        pipeline_checks(rec, s, None, "update_actor", "actor", False)
    elif mini is not None and m and mini % m == 0:
        pipeline_checks(rec, s, mini // m, "update_actor", "actor", True)
