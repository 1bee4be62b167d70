"""The Megatron backend's start-up and worker-init rules: ``validate_config``'s Megatron branch and
``McoreEngineConfig`` at start-up, then 0.9.1's ``MegatronEngine`` (dynamic CP, megatron-core's mesh, the model) or
0.7.1's ``megatron_workers.py`` (mesh, normalisation, model) at worker init. The arithmetic lives in
``labkit.rules.megatron_rules``; this module adds where, why and the role (``megatron_verdicts``). ``startup`` and
``worker_init`` list these rules in verl's order; the step-1 pipeline checks are ``megatron_passes``.
"""

from __future__ import annotations

from labkit.rules import megatron_config_rules as mcr
from labkit.rules import megatron_rules as mr
from labkit.rules import pipeline_layout
from labkit.rules.catalogue import message
from labkit.validate.megatron_verdicts import IMPL, MG_W, add_verdict, megatron_key
from labkit.validate.rulebook import CRITIC, ENGINE, LEGACY, MEGATRON, REF_ENGINE, STATIC, rule
from labkit.validate.snapshot import INIT, NOTICE, SILENT, STARTUP, Recorder, Snap


# -- start-up ---------------------------------------------------------------------------------------------------------
@rule("E2 M1 E1", when=MEGATRON & STATIC)
def megatron_validate_config(rec: Recorder, s: Snap) -> None:
    """validate_config's Megatron branch (skipped with dynamic bsz): E2, minimal_bsz = DP x m (M1), then E1."""
    lay = s.geo.parallel
    for v in mcr.validate_config_megatron(
        s.world_size, lay.tp, lay.pp, lay.cp, s.ppo_micro_batch_size_per_gpu, s.train_batch_size, s.rollout_n
    ):
        add_verdict(rec, v, STARTUP, "trainer")


def _engine_config(rec: Recorder, s: Snap, role: str, tp: object) -> None:
    """``McoreEngineConfig.__post_init__`` of one role's megatron section: M2 (dynamic CP, 0.9.1), M3 (SP at TP 1)."""
    dcp = bool(megatron_key(s, "dynamic_context_parallel", role)) and not s.legacy
    max_seqlen = None if s.legacy else megatron_key(s, "max_seqlen_per_dp_cp_rank", role)
    for v in mcr.engine_config_checks(tp, bool(megatron_key(s, "sequence_parallel", role)), dcp, max_seqlen):
        add_verdict(rec, v, STARTUP, role)


@rule("M2 M3", when=MEGATRON)
def actor_engine_config(rec: Recorder, s: Snap) -> None:
    """The actor's McoreEngineConfig, which ``omega_conf_to_dataclass`` builds before ActorConfig's checks."""
    _engine_config(rec, s, "actor", s.geo.parallel.tp)


@rule("M2 M3", when=MEGATRON & CRITIC)
def critic_engine_config(rec: Recorder, s: Snap) -> None:
    """The critic's McoreEngineConfig (critic.megatron: its literal defaults, TP = 1), built when validate_config
    turns the critic section into a ``McoreCriticConfig``."""
    _engine_config(rec, s, "critic", megatron_key(s, "tensor_model_parallel_size", "critic"))


# -- worker init ------------------------------------------------------------------------------------------------------
def _shape_checks(rec: Recorder, s: Snap, role: str) -> bool:
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
        *(megatron_key(s, f"{tc}.recompute_{k}", role) for k in ("granularity", "method", "num_layers", "modules")),
    )
    first = megatron_key(s, f"{tc}.num_layers_in_first_pipeline_stage", role)
    last = megatron_key(s, f"{tc}.num_layers_in_last_pipeline_stage", role)
    layout = megatron_key(s, f"{tc}.pipeline_model_parallel_layout", role)
    if layout is not None:  # TransformerConfig validates the custom layout; it replaces the even split
        verdicts += pipeline_layout.layout_verdicts(layout, lay.pp, lay.vpp, s.num_layers)
        verdicts += mr.model_build_checks(lay.tp, lay.pp, None, lay.ep, None, s.num_experts, s.vocab_size)
    elif (first is not None or last is not None) and s.num_layers is not None:  # get_num_layers_to_build, uneven
        verdicts += mr.model_build_checks(lay.tp, lay.pp, lay.vpp, lay.ep, None, s.num_experts, s.vocab_size)
        verdicts.append(mr.uneven_pipeline_layers(s.num_layers, lay.pp, first, last))
    else:  # the embedding and the loss count as layers of the split when the config accounts for them
        layers = None if s.num_layers is None else s.num_layers + lay.split_slots
        verdicts += mr.model_build_checks(lay.tp, lay.pp, lay.vpp, lay.ep, layers, s.num_experts, s.vocab_size)
    return any(add_verdict(rec, v, INIT, role) for v in verdicts)  # stops at the first that raised


def _mesh_checks(rec: Recorder, s: Snap, role: str) -> bool:
    """initialize_model_parallel (M7-M9); True when it raised."""
    lay = s.geo.parallel
    etp = megatron_key(s, "expert_tensor_parallel_size")
    verdicts = mr.model_parallel_init(s.world_size, lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, etp)
    return any(add_verdict(rec, v, INIT, role) for v in verdicts)


def layout_notice(rec: Recorder, s: Snap, role: str) -> None:
    """M24: verl builds one Megatron layout per process from the first engine; other roles' sizes are ignored."""
    keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
            "expert_model_parallel_size", "virtual_pipeline_model_parallel_size")  # fmt: skip
    diff = [
        f"{role}.megatron.{k} = {megatron_key(s, k, role)} vs actor {megatron_key(s, k)}"
        for k in keys
        if megatron_key(s, k, role) != megatron_key(s, k)
    ]
    rec.add(
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


def engine_init(rec: Recorder, s: Snap, role: str) -> bool:
    """0.9.1 ``MegatronEngine.__init__`` + ``initialize`` of the first engine built (the ref's when a reference policy
    is used, else the actor's): dynamic CP (M4-M6), the mesh (M7-M9), then the model (M10-M19). True: it raised."""
    if role == "ref":
        layout_notice(rec, s, "ref")
    dcp = bool(megatron_key(s, "dynamic_context_parallel"))
    if any(
        add_verdict(rec, v, INIT, role)
        for v in mr.dynamic_cp_checks(dcp, bool(s.use_remove_padding), s.geo.parallel.vpp)
    ):
        return True
    return _mesh_checks(rec, s, role) or _shape_checks(rec, s, role)


@rule("M24 M4-M19", when=ENGINE & MEGATRON & REF_ENGINE)
def ref_engine_init(rec: Recorder, s: Snap, norm: dict) -> bool:
    """The ref's MegatronEngine is built first and fixes the layout of the process; verl stops if it raised."""
    return engine_init(rec, s, "ref")


@rule("M4-M19", when=ENGINE & MEGATRON & ~REF_ENGINE)
def actor_engine_init(rec: Recorder, s: Snap, norm: dict) -> bool:
    """Without a ref engine the actor's MegatronEngine is the first built; verl stops if it raised."""
    return engine_init(rec, s, "actor")


@rule("M24", when=ENGINE & MEGATRON & CRITIC)
def critic_layout_notice(rec: Recorder, s: Snap, norm: dict) -> None:
    """The critic's engine runs on the layout the first engine fixed (M24)."""
    layout_notice(rec, s, "critic")


def legacy_init(rec: Recorder, s: Snap) -> dict:
    """0.7.1 ``ActorRolloutRefWorker.__init__`` (mesh, then ``*= n; //= DP`` with no asserts), ``init_model`` (the
    model checks), ``CriticWorker.__init__``; returns the normalised sizes (M', Mc', per-GPU micro sizes)."""
    where = f"{MG_W}: ActorRolloutRefWorker.__init__"
    norm: dict = {}
    if _mesh_checks(rec, s, "actor"):
        return norm
    D = s.geo.parallel.dp_size
    norm["Mp"] = s.ppo_mini_batch_size * s.rollout_n // D
    norm["actor"], norm["rollout"] = s.ppo_micro_batch_size_per_gpu, s.log_prob_micro_batch_size_per_gpu
    norm["ref"] = s.ref_log_prob_micro_batch_size_per_gpu  # the fused worker never normalises the ref's keys
    rec.add(
        False, "GA", None, "", INIT, where,
        [f"M' = ({s.ppo_mini_batch_size} x {s.rollout_n}) // DP {D} = {norm['Mp']}"],
        "The legacy Megatron worker normalises the mini-batch per DP rank and asserts nothing.",
        role="actor",
    )  # fmt: skip
    u = s.ppo_micro_batch_size
    if u:
        norm["actor"] = u // D
        rec.add(True, "S4", None, message("S4", key="actor_rollout_ref.actor.ppo_micro_batch_size", value=u,
                per_gpu=u // D), INIT, where, [f"{u} // {D} = {u // D}"],
                "The deprecated global micro size is divided by the DP size and copied into *_per_gpu.", SILENT,
                role="actor")  # fmt: skip
        lp = s.log_prob_micro_batch_size
        if rec.add(
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
    _shape_checks(rec, s, "actor")  # init_model: the sizes above are already normalised
    if s.need_critic:
        Mc = s.critic_ppo_mini_batch_size * s.rollout_n // D
        norm["Mcp"], norm["critic"] = Mc, s.critic_ppo_micro_batch_size_per_gpu
        if s.critic_ppo_micro_batch_size:
            norm["critic"] = s.critic_ppo_micro_batch_size // D
    return norm


@rule("M7-M19 GA S4 X8", when=LEGACY & MEGATRON)
def legacy_megatron_init(rec: Recorder, s: Snap, norm: dict) -> bool:
    """verl 0.7.1's megatron_workers.py; verl stops when the mesh or the in-place normalisation raised (nothing is
    normalised then, and the rollout is never built)."""
    got = legacy_init(rec, s)
    norm.update(got)
    return not got
