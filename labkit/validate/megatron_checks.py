"""The Megatron backend's checks recorded in execution order: start-up (``validate_config``'s Megatron branch and
``McoreEngineConfig``), worker init (0.9.1 ``MegatronEngine``; 0.7.1 ``megatron_workers.py``) and the pipeline checks
of every forward and update pass at step 1. The arithmetic lives in ``labkit.rules.megatron_rules``; this module adds
where, why and the role, and feeds ``Run`` the way ``startup``, ``worker_init`` and ``first_step`` do.
"""

from __future__ import annotations

from labkit.rules import megatron_rules as mr
from labkit.rules import megatron_schedule as ms
from labkit.rules import pipeline_layout
from labkit.rules.catalogue import message
from labkit.validate.snapshot import AE, INIT, NOTICE, SILENT, STARTUP, STEP1, Run, Snap, mod

CFG_PY, ENGINE_PY = (
    "verl/utils/config.py: validate_config",
    "verl/workers/config/engine.py: McoreEngineConfig.__post_init__",
)
IMPL = "verl/workers/engine/megatron/transformer_impl.py: MegatronEngine"
MG_W = "verl/workers/megatron_workers.py"
MCORE = "megatron/core"
WHERE = {
    "E2": CFG_PY,
    "M1": CFG_PY,
    "E1": CFG_PY,
    "M2": ENGINE_PY,
    "M3": ENGINE_PY,
    "M4": f"{IMPL}.__init__ -> _check_dcp_unsupported_features",
    "M5": f"{IMPL}.__init__ -> _check_dcp_unsupported_features",
    "M6": f"{IMPL}._init_device_mesh -> verl/utils/dynamic_cp_scheduler.py: get_megatron_dynamic_cp_scheduler_cls",
    "M7": f"{MCORE}/parallel_state.py: initialize_model_parallel",
    "M8": f"{MCORE}/parallel_state.py: initialize_model_parallel",
    "M9": f"{MCORE}/parallel_state.py: initialize_model_parallel",
    "M10": f"{MCORE}/model_parallel_config.py: ModelParallelConfig.__post_init__",
    "M11": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M12": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M13": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M14": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M15": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M16": f"{MCORE}/tensor_parallel/utils.py: VocabUtility.vocab_range_from_global_vocab_size",
    "M17": f"{MCORE}/transformer/transformer_block.py: get_num_layers_to_build",
    "M18": f"{MCORE}/transformer/transformer_block.py: get_num_layers_to_build",
    "M19": f"{MCORE}/transformer/moe/moe_layer.py: MoELayer.__init__",
    "M20": f"{MCORE}/transformer/transformer_block.py: get_num_layers_to_build",
    "M26": f"{MCORE}/transformer/pipeline_parallel_layer_layout.py: PipelineParallelLayerLayout",
    "M22": f"{MCORE}/pipeline_parallel/schedules.py: forward_backward_pipelining_with_interleaving",
    "M23": f"{MCORE}/pipeline_parallel/schedules.py: forward_backward_pipelining_with_interleaving",
}
WHY = {
    "E2": "With the Megatron backend every model replica needs TP x PP x CP whole GPUs (checked without dynamic bsz).",
    "M1": "validate_config computes minimal_bsz = DP x actor.ppo_micro_batch_size_per_gpu; the key is null.",
    "E1": "Without dynamic batch size the B x n samples must split into DP ranks of whole micro-batches of m.",
    "M2": "Dynamic context parallel needs a positive max_seqlen_per_dp_cp_rank.",
    "M3": "verl prints this and builds the model without sequence parallel (megatron-core refuses SP at TP = 1).",
    "M4": "Dynamic CP packs sequences (THD), so padding removal must be on.",
    "M5": "Dynamic CP and the interleaved (virtual) pipeline schedule do not mix.",
    "M6": "megatron-core 0.16.1 has no dynamic-CP scheduler; verl refuses dynamic_context_parallel with it.",
    "M7": "megatron-core's DP = W / (TP x PP x CP) must be whole.",
    "M8": "A virtual pipeline size needs at least two pipeline stages.",
    "M9": "The expert layout ETP x EP x PP must divide the GPUs (expert DP = W / (ETP x EP x PP)).",
    "M10": "megatron-core only warns: expert parallel with TP and without SP.",
    "M11": "Tensor parallel splits the attention heads.",
    "M12": "KV heads (query groups) are split over TP, or replicated when TP is a multiple of them.",
    "M13": "Expert parallel needs an MoE model.",
    "M14": "The recompute settings of override_transformer_config are inconsistent.",
    "M15": "selective recompute accepts only megatron-core's module names.",
    "M16": "The embedding and output layer split the vocabulary over TP; verl pads nothing.",
    "M17": "Every pipeline stage builds the same number of decoder layers.",
    "M18": "Each stage's layers are cut into VPP model chunks.",
    "M19": "Bare assert: every EP rank holds the same number of experts.",
    "M20": "With num_layers_in_first/last_pipeline_stage the other stages split the layers left over evenly.",
    "M26": "A custom pipeline layout places every decoder layer itself: E first, L last, t as many as the model has.",
    "M22": "The interleaved schedule runs micro-batches in groups of G; G must lie in [PP, micro-batches].",
    "M23": "A last group of fewer than PP micro-batches would stall the interleaved pipeline.",
}


def _add(run: Run, v: mr.Verdict, when: str, role: str, where: str | None = None, why: str | None = None) -> bool:
    """Record one verdict; warnings are notices. Returns True when it raised."""
    sev = NOTICE if v.exc_type is None else "error"
    run.add(
        v.fired,
        v.code,
        v.exc_type,
        v.message,
        when,
        where or WHERE[v.code],
        list(v.arithmetic),
        why or WHY[v.code],
        sev,
        role,
    )
    return v.fired and v.exc_type is not None


def _mg(s: Snap, leaf: str, role: str = "actor") -> object:
    prefix = {"actor": "actor_rollout_ref.actor", "ref": "actor_rollout_ref.ref", "critic": "critic"}[role]
    return s.cfg.get(f"{prefix}.megatron.{leaf}")


def megatron_startup(run: Run, s: Snap) -> None:
    """validate_config's Megatron branch (E2, M1, E1; skipped with dynamic bsz), then the actor's McoreEngineConfig
    (M2 dynamic CP on 0.9.1, M3 the SP warning) that ``omega_conf_to_dataclass`` builds before ActorConfig's checks."""
    lay = s.geo.parallel
    if not s.use_dynamic_bsz:
        verdicts = mr.validate_config_megatron(
            s.world_size, lay.tp, lay.pp, lay.cp, s.ppo_micro_batch_size_per_gpu, s.train_batch_size, s.rollout_n
        )
        for v in verdicts:
            _add(run, v, STARTUP, "trainer")
    dcp = bool(_mg(s, "dynamic_context_parallel")) and not s.legacy
    for v in mr.engine_config_checks(
        lay.tp, bool(_mg(s, "sequence_parallel")), dcp, None if s.legacy else _mg(s, "max_seqlen_per_dp_cp_rank")
    ):
        _add(run, v, STARTUP, "actor")


def critic_engine_config(run: Run, s: Snap) -> None:
    """The critic's ``McoreEngineConfig.__post_init__`` (M2, M3 on critic.megatron), built when validate_config turns
    the critic section into a ``McoreCriticConfig``."""
    dcp = bool(_mg(s, "dynamic_context_parallel", "critic")) and not s.legacy
    for v in mr.engine_config_checks(
        _mg(s, "tensor_model_parallel_size", "critic"),
        bool(_mg(s, "sequence_parallel", "critic")),
        dcp,
        None if s.legacy else _mg(s, "max_seqlen_per_dp_cp_rank", "critic"),
    ):
        _add(run, v, STARTUP, "critic")


def _shape_checks(run: Run, s: Snap, role: str, where_role: str) -> bool:
    """TransformerConfig.__post_init__ then the model build (M10-M19); True when one raised."""
    lay, tc = s.geo.parallel, "override_transformer_config"
    verdicts = mr.transformer_config_checks(
        lay.tp,
        lay.sequence_parallel,
        lay.ep,
        lay.pp,
        s.heads,
        s.kv_heads,
        s.num_experts,
        s.num_layers,
        _mg(s, f"{tc}.recompute_granularity", role),
        _mg(s, f"{tc}.recompute_method", role),
        _mg(s, f"{tc}.recompute_num_layers", role),
        _mg(s, f"{tc}.recompute_modules", role),
    )
    first = _mg(s, f"{tc}.num_layers_in_first_pipeline_stage", role)
    last = _mg(s, f"{tc}.num_layers_in_last_pipeline_stage", role)
    layout = _mg(s, f"{tc}.pipeline_model_parallel_layout", role)
    if layout is not None:  # TransformerConfig validates the custom layout; it replaces the even split
        verdicts += pipeline_layout.layout_verdicts(layout, lay.pp, lay.vpp, s.num_layers)
        verdicts += mr.model_build_checks(lay.tp, lay.pp, None, lay.ep, None, s.num_experts, s.vocab_size)
    elif (first is not None or last is not None) and s.num_layers is not None:  # get_num_layers_to_build, uneven
        verdicts += mr.model_build_checks(lay.tp, lay.pp, lay.vpp, lay.ep, None, s.num_experts, s.vocab_size)
        verdicts.append(mr.uneven_pipeline_layers(s.num_layers, lay.pp, first, last))
    else:  # the embedding and the loss count as layers of the split when the config accounts for them
        layers = None if s.num_layers is None else s.num_layers + lay.split_slots
        verdicts += mr.model_build_checks(lay.tp, lay.pp, lay.vpp, lay.ep, layers, s.num_experts, s.vocab_size)
    for v in verdicts:
        if _add(run, v, INIT, where_role):
            return True
    return False


def _mesh_checks(run: Run, s: Snap, role: str) -> bool:
    """initialize_model_parallel (M7-M9); True when it raised."""
    lay = s.geo.parallel
    etp = _mg(s, "expert_tensor_parallel_size")
    for v in mr.model_parallel_init(s.world_size, lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, etp):
        if _add(run, v, INIT, role):
            return True
    return False


def layout_notice(run: Run, s: Snap, role: str) -> None:
    """M24: verl builds one Megatron layout per process from the first engine; other roles' sizes are ignored."""
    keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
            "expert_model_parallel_size", "virtual_pipeline_model_parallel_size")  # fmt: skip
    diff = [
        f"{role}.megatron.{k} = {_mg(s, k, role)} vs actor {_mg(s, k)}" for k in keys if _mg(s, k, role) != _mg(s, k)
    ]
    run.add(
        bool(diff),
        "M24",
        None,
        message("M24", role=role),
        INIT,
        f"{IMPL}._init_device_mesh",
        diff or [f"{role}: same sizes as the actor"],
        "Colocated roles share one process and megatron-core's global state: the first engine built fixes "
        "TP/PP/CP/EP/VPP for all of them, and verl does not detect a mismatch.",
        NOTICE,
        role=role,
    )


def engine_init(run: Run, s: Snap, role: str) -> bool:
    """0.9.1 ``MegatronEngine.__init__`` + ``initialize`` of the first engine built (the ref's when a reference policy
    is used, else the actor's): dynamic CP (M4-M6), the mesh (M7-M9), then the model (M10-M19). True: it raised."""
    if role == "ref":
        layout_notice(run, s, "ref")
    dcp = bool(_mg(s, "dynamic_context_parallel"))
    lay = s.geo.parallel
    for v in mr.dynamic_cp_checks(dcp, bool(s.use_remove_padding), lay.vpp):
        if _add(run, v, INIT, role):
            return True
    return _mesh_checks(run, s, role) or _shape_checks(run, s, role, role)


def legacy_init(run: Run, s: Snap) -> dict:
    """0.7.1 ``ActorRolloutRefWorker.__init__`` (mesh, then ``*= n; //= DP`` with no asserts), ``init_model`` (the
    model checks), ``CriticWorker.__init__``; returns the normalised sizes (M', Mc', per-GPU micro sizes)."""
    where = f"{MG_W}: ActorRolloutRefWorker.__init__"
    norm: dict = {}
    if _mesh_checks(run, s, "actor"):
        return norm
    D = s.geo.parallel.dp_size
    norm["Mp"] = s.ppo_mini_batch_size * s.rollout_n // D
    norm["actor"], norm["rollout"] = s.ppo_micro_batch_size_per_gpu, s.log_prob_micro_batch_size_per_gpu
    norm["ref"] = s.ref_log_prob_micro_batch_size_per_gpu  # the fused worker never normalises the ref's keys
    run.add(
        False, "GA", None, "", INIT, where,
        [f"M' = ({s.ppo_mini_batch_size} x {s.rollout_n}) // DP {D} = {norm['Mp']}"],
        "The legacy Megatron worker normalises the mini-batch per DP rank and asserts nothing.",
        role="actor",
    )  # fmt: skip
    u = s.ppo_micro_batch_size
    if u:
        norm["actor"] = u // D
        run.add(True, "S4", None, message("S4", key="actor_rollout_ref.actor.ppo_micro_batch_size", value=u,
                per_gpu=u // D), INIT, where, [f"{u} // {D} = {u // D}"],
                "The deprecated global micro size is divided by the DP size and copied into *_per_gpu.", SILENT,
                role="actor")  # fmt: skip
        lp = s.log_prob_micro_batch_size
        if run.add(
            lp is None,
            "X8",
            "TypeError",
            message("X8"),
            INIT,
            where,
            [f"actor.ppo_micro_batch_size = {u}", "rollout.log_prob_micro_batch_size = None", f"None //= {D}"],
            "With the deprecated actor micro size set, the worker also divides rollout.log_prob_micro_batch_size "
            "in place; it is null.",
            role="rollout",
        ):
            return {}
        norm["rollout"] = lp // D
    _shape_checks(run, s, "actor", "actor")  # init_model: the sizes above are already normalised
    if s.need_critic:
        Mc = s.critic_ppo_mini_batch_size * s.rollout_n // D
        norm["Mcp"], norm["critic"] = Mc, s.critic_ppo_micro_batch_size_per_gpu
        if s.critic_ppo_micro_batch_size:
            norm["critic"] = s.critic_ppo_micro_batch_size // D
    return norm


def pipeline_checks(run: Run, s: Snap, count: int | None, stage: str, role: str, static: bool) -> bool:
    """The micro-batch count of one pass against VPP: verl's assert (M21; 0.9.1 static and dynamic, 0.7.1 dynamic;
    a dynamic count is rounded up to G so it cannot fire) and megatron-core's interleaved checks (M22, M23)."""
    lay = s.geo.parallel
    g = _mg(s, "override_transformer_config.microbatch_group_size_per_vp_stage")
    div = ms.num_batches_divided_by(lay.pp, lay.vpp, g)
    where = (
        f"{IMPL}.forward_backward_batch ({stage})"
        if not s.legacy
        else f"verl/workers/actor/megatron_actor.py: MegatronPPOActor.forward_backward_batch ({stage})"
    )
    if static and count is not None and not s.legacy:
        v = ms.vpp_micro_batch_check(count, div, s.profile)
        if _add(run, v, STEP1, role, where, "verl's static micro-batching is not rounded to G under VPP: rows / m "
                "must be a multiple of G."):  # fmt: skip
            return True
    if count is None:  # dynamic: the count is a multiple of G when VPP > 1; only G < PP is certain
        v = ms.dynamic_group_check(lay.pp, lay.vpp, g)
        return v is not None and _add(run, v, STEP1, role, f"{WHERE['M22']} ({stage})", WHY["M22"] + " Dynamic "
                                      "micro-batch counts are rounded up to a multiple of G, so only G < PP is certain.")  # fmt: skip
    for v in ms.interleaved_schedule_checks(count, lay.pp, lay.vpp, g):
        if _add(run, v, STEP1, role, f"{WHERE[v.code]} ({stage})"):
            return True
    return False


def legacy_static_forward(run: Run, s: Snap, rows: int, micro: int | None, key: str, stage: str, role: str) -> None:
    """0.7.1 static forward-only pass: asserts the micro size is set (M25), ``split(m)`` (ragged allowed), then the
    pipeline checks on ceil(rows / m)."""
    where = f"verl/workers/actor/megatron_actor.py: MegatronPPOActor.compute_log_prob ({stage})"
    if run.add(micro is None, "M25", AE, message("M25"), STEP1, where, [f"{key} = None"],
               "The legacy Megatron worker copies a deprecated log-prob micro size into *_per_gpu only when the actor's "
               "deprecated ppo_micro_batch_size is set; nothing reaches this pass.", role=role):  # fmt: skip
        return
    count = ms.static_micro_batches(rows, micro)
    run.add(rows % micro != 0, "S3", None, message("S3", stage=stage, rows=rows, sizes=_sizes(rows, micro)), STEP1,
            where, [f"ceil({rows} / {micro}) = {count} micro-batches"],
            "split(m) allows a short last micro-batch.", SILENT, role=role)  # fmt: skip
    pipeline_checks(run, s, count, stage, role, True)


def _sizes(rows: int, size: int) -> str:
    full, rest = divmod(rows, size)
    return " + ".join(f"{c} x {n}" for c, n in ((full, size), (1, rest)) if c and n)


def legacy_update(run: Run, s: Snap, rows: int, Mp: int, micro: int | None, dyn: bool, role: str) -> None:
    """0.7.1 update_policy / update_critic: ``DataProto.make_iterator(M')`` (X1 when M' = 0, E29 when it does not
    divide the rows), then the micro-batches of one mini-batch (``split(m)`` or the token budget x CP)."""
    where = "verl/protocol.py: DataProto.make_iterator"
    if run.add(Mp == 0, "X1", "ZeroDivisionError", "integer modulo by zero", STEP1, where,
               [f"M' = ({'critic ' if role == 'critic' else ''}M x n) // DP = {Mp}"],
               "The normalised mini-batch floors to 0 (M x n < DP) and make_iterator divides by it.", role=role):  # fmt: skip
        return
    if run.add(rows % Mp != 0, "E29", AE, message("E29", rows=rows, mini=Mp), STEP1, where,
               [f"rows per rank = {rows}", f"M' = {Mp}", mod(rows, Mp)],
               "Each rank's rows must be a whole number of mini-batches (DataProto.make_iterator).", role=role):  # fmt: skip
        return
    if dyn:
        pipeline_checks(run, s, None, f"update_{role}", role, False)
    elif micro:
        pipeline_checks(run, s, ms.static_micro_batches(Mp, micro), f"update_{role}", role, True)
