"""Which config keys drive each forward/update stage, per profile: mesh (Ulysses sp → D), dynamic flag, token
budget, micro size, remove-padding. Kept apart from the stage arithmetic because the two profiles read different keys.

Legacy (verl ≤ 0.7 ``fsdp_workers.py``): log-prob keys from ``rollout.*`` / ``ref.*`` on the actor's Ulysses mesh,
critic keys from ``critic.*``; deprecated global micro sizes are floor-divided by W//sp. Engine (0.9.1
``engine_workers.py``): rows arrive unpadded (``left_right_2_no_padding``) and are packed when the model's
``use_remove_padding`` is on, else padded to the micro-batch's longest row
(``FSDPEngineWithLMHead.prepare_model_inputs``); the actor's ``use_dynamic_bsz`` drives
old log-prob; the critic engine is dynamic on its own sp=1 mesh with ``ppo_infer_max_token_len_per_gpu`` (32768
unless ``+critic.ppo_infer_max_token_len_per_gpu`` sets it) for values, and for the update too in the v1 loop
(``RayPPOTrainer.init_workers``; v1 ``PPOTrainer._setup``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.plan.context import Ctx
from labkit.plan.megatron_passes import megatron_params
from labkit.rules.failures import mesh_failure
from labkit.rules.geometry import ARR

ENGINE_CRITIC_INFER_BUDGET = 32768  # verl 0.9.1 CriticConfig.ppo_infer_max_token_len_per_gpu default
INFER_KEY = "critic.ppo_infer_max_token_len_per_gpu"  # CriticConfig's field, in no YAML: set as +critic.…


def critic_infer_budget(ctx: Ctx) -> int:
    """The engine critic's ``ppo_infer_max_token_len_per_gpu``: the values pass's budget, and the update's too in
    the v1 loop (``RayPPOTrainer.init_workers``; v1 ``PPOTrainer._setup``)."""
    return int(ctx.cfg.raw(INFER_KEY, ENGINE_CRITIC_INFER_BUDGET))


WHERE = {
    "old_log_prob": "ActorRolloutRefWorker.compute_log_prob → DataParallelPPOActor.compute_log_prob",
    "ref_log_prob": "ActorRolloutRefWorker.compute_ref_log_prob → DataParallelPPOActor.compute_log_prob",
    "values": "verl/workers/fsdp_workers.py: CriticWorker.compute_values",
    "update_actor": "verl/workers/actor/dp_actor.py: DataParallelPPOActor.update_policy",
    "update_critic": "verl/workers/critic/dp_critic.py: DataParallelPPOCritic.update_critic",
}
WHERE_ENGINE = {
    "old_log_prob": "RayPPOTrainer._compute_old_log_prob → TrainingWorker.infer_batch → prepare_micro_batches",
    "ref_log_prob": "RayPPOTrainer._compute_ref_log_prob → TrainingWorker.infer_batch → prepare_micro_batches",
    "values": "RayPPOTrainer._compute_values → TrainingWorker.infer_batch (critic engine)",
    "update_actor": "verl/workers/engine_workers.py: TrainingWorker.train_mini_batch",
    "update_critic": "verl/workers/engine_workers.py: TrainingWorker.train_mini_batch (critic engine)",
}
TITLES = {
    "old_log_prob": "old log-prob",
    "ref_log_prob": "ref log-prob",
    "values": "values (critic)",
    "update_actor": "actor update",
    "update_critic": "critic update",
}


def _both(section: str, key: str) -> str:
    return f"[{section}] Please set at least one of '{section}.{key}' or '{section}.{key}_per_gpu'."


# verl's messages when no micro size is set and dynamic batching is off (validate_config / ActorConfig / CriticConfig)
_MISSING = {
    "old_log_prob": ("E3", "ValueError", _both(f"{ARR}.rollout", "log_prob_micro_batch_size")),
    "ref_log_prob": ("E3", "ValueError", _both(f"{ARR}.ref", "log_prob_micro_batch_size")),
    "update_actor": (
        "E7",
        "AssertionError",
        "[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
        "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled.",
    ),
    "values": ("E13", "ValueError", _both("critic", "micro_batch_size")),
    "update_critic": ("E13", "ValueError", _both("critic", "micro_batch_size")),
}
# stage -> (micro, deprecated micro, dynamic flag, budget, sp) keys on the legacy path
_KEYS = {
    "old_log_prob": (
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
        f"{ARR}.rollout.log_prob_micro_batch_size",
        f"{ARR}.rollout.log_prob_use_dynamic_bsz",
        f"{ARR}.rollout.log_prob_max_token_len_per_gpu",
        f"{ARR}.actor.ulysses_sequence_parallel_size",
    ),
    "ref_log_prob": (
        f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
        f"{ARR}.ref.log_prob_micro_batch_size",
        f"{ARR}.ref.log_prob_use_dynamic_bsz",
        f"{ARR}.ref.log_prob_max_token_len_per_gpu",
        f"{ARR}.ref.ulysses_sequence_parallel_size",
    ),
    "values": (
        "critic.forward_micro_batch_size_per_gpu",
        "critic.forward_micro_batch_size",
        "critic.use_dynamic_bsz",
        "critic.forward_max_token_len_per_gpu",
        "critic.ulysses_sequence_parallel_size",
    ),
    "update_actor": (
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
        f"{ARR}.actor.ppo_micro_batch_size",
        f"{ARR}.actor.use_dynamic_bsz",
        f"{ARR}.actor.ppo_max_token_len_per_gpu",
        f"{ARR}.actor.ulysses_sequence_parallel_size",
    ),
    "update_critic": (
        "critic.ppo_micro_batch_size_per_gpu",
        "critic.ppo_micro_batch_size",
        "critic.use_dynamic_bsz",
        "critic.ppo_max_token_len_per_gpu",
        "critic.ulysses_sequence_parallel_size",
    ),
}


@dataclass
class Params:
    """What one stage runs with: mesh sp (D = W // sp), budget sp, dynamic flag, budget, micro size, packing."""

    sp: int
    budget_sp: int
    dyn: bool
    budget: int | None
    micro: int | None
    rmpad: bool
    missing: tuple[str, str, str]
    keys: list[str] = field(default_factory=list)
    where: str = ""
    notes: list[str] = field(default_factory=list)
    D: int = 0
    slice_sp: int = 0  # sp that pads/slices packed rows (legacy ref: ref sp on the actor's mesh); 0 → sp
    vpp_group: int | None = None  # Megatron with virtual PP: G, what the micro-batch count must divide by
    megatron: bool = False  # the pass runs on Megatron's layout (labkit.plan.megatron_passes)


def _micro(ctx: Ctx, key: str, deprecated: str, sp: int) -> int | None:
    """Per-GPU micro size; legacy floor-divides the deprecated global key by W//sp.

    Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker.__init__ (normalization)."""
    m = ctx.get(key)
    dep = ctx.get(deprecated)
    # the worker overwrites the *_per_gpu key whenever the deprecated one is set (E4 stops a config setting both to
    # values); unset, the twin may interpolate the raw global value, so it is not read either
    if dep is not None and ctx.profile == "legacy" and (not ctx.cfg.is_set(key) or m is None):
        m = dep // (
            ctx.geo.world_size // sp
        )  # the *_per_gpu twin may interpolate the raw global value; 0 stays 0 (X1/X2)
        rel = ctx.cfg.release
        if rel is not None and rel.memory.micro_times_n and not key.startswith("critic."):
            m *= ctx.get(f"{ARR}.rollout.n")  # verl's main of January 2025: global micro sizes count prompts
    return m


def params(ctx: Ctx, name: str) -> Params:
    """Resolve the stage's parameters for ``ctx.profile``; a (dp, sp) mesh that cannot be built raises."""
    micro_k, dep_k, dyn_k, budget_k, sp_k = _KEYS[name]
    legacy = ctx.profile == "legacy"
    critic = name in ("values", "update_critic")
    notes: list[str] = []
    sp = budget_sp = ctx.get(sp_k)
    if legacy and name == "ref_log_prob":  # the ref worker builds the actor's Ulysses mesh and is dispatched on it
        sp = ctx.get(f"{ARR}.actor.ulysses_sequence_parallel_size")
        if sp != budget_sp:
            # DataParallelPPOActor(config.ref) pads/slices by ref sp and gathers only if ref sp > 1; the attention
            # patch all-to-alls over the actor's SP group (ActorRolloutRefWorker.__init__, dp_actor.py)
            notes.append(
                f"ref sp {budget_sp} ≠ actor sp {sp}: the ref is dispatched on the actor's (dp, sp) mesh "
                f"but pads/slices by ref sp"
                + (
                    " (each SP rank runs every token of its DP group)"
                    if budget_sp == 1
                    else "; verl slices with the wrong group: unsupported"
                )
            )
    engine_critic = critic and not legacy
    if engine_critic:  # verl's critic engine: dynamic on its own budget, whatever critic.use_dynamic_bsz says
        dyn, budget = True, critic_infer_budget(ctx) if name == "values" or ctx.v1 else ctx.get(budget_k)
    else:
        dyn, budget = bool(ctx.get(dyn_k)), ctx.get(budget_k)
    # legacy: the actor's DataParallelPPOActor reads actor.use_remove_padding; the ref's is overwritten with
    # model.use_remove_padding (ActorRolloutRefWorker.init_model); the critic reads critic.model.use_remove_padding
    owner = "critic.model" if critic else f"{ARR}.model" if name == "ref_log_prob" else f"{ARR}.actor"
    rmpad = bool(ctx.get(f"{owner}.use_remove_padding"))
    if not legacy:
        # TrainingWorker passes model_config.use_remove_padding; off → to_padded_tensor up to the micro-batch's
        # longest row (verl/workers/engine/fsdp/transformer_impl.py: FSDPEngineWithLMHead.prepare_model_inputs)
        rmpad = bool(ctx.get("critic.model.use_remove_padding" if critic else f"{ARR}.model.use_remove_padding"))
        if name == "old_log_prob":
            dyn = bool(ctx.get(f"{ARR}.actor.use_dynamic_bsz"))
        if critic:
            sp = budget_sp = 1
            notes.append(
                "0.9.1 critic engine: dynamic micro-batching on its own sp=1 mesh; critic micro sizes, "
                "use_dynamic_bsz and ulysses_sequence_parallel_size are not passed to it; its budget is "
                + ("ppo_infer_max_token_len_per_gpu in both passes (v1 loop)" if ctx.v1 else
                   "ppo_infer_max_token_len_per_gpu for values, ppo_max_token_len_per_gpu for the update")
            )  # fmt: skip
    missing = _MISSING[name]
    if name in ("old_log_prob", "ref_log_prob") and ctx.get(f"{ARR}.actor.use_dynamic_bsz"):
        # validate_config's E3 is keyed on the *actor's* use_dynamic_bsz: skipped, so the None micro size reaches
        # DataProto.split (legacy) / prepare_micro_batches (engine) and fails there at step 1
        missing = (
            "X3",
            "TypeError",
            "'NoneType' object cannot be interpreted as an integer"
            if legacy
            else "unsupported operand type(s) for *: 'int' and 'NoneType'",
        )
    elif not legacy and name == "old_log_prob" and ctx.get(dep_k) is not None and ctx.get(micro_k) is None:
        # E3 passes (the deprecated global key is set), and the engine never normalises it: init_model's bare
        # assert on log_prob_micro_batch_size_per_gpu stops the worker (B2)
        missing = ("B2", "AssertionError", "")
    if ctx.geo.parallel.engine == "veomni" and not critic:  # VeOmni's own Ulysses size (veomni.ulysses_parallel_size)
        sp = budget_sp = ctx.geo.parallel.ulysses_sp
    megatron = ctx.geo.parallel.is_megatron
    if megatron:
        sp = budget_sp = 1
        if not ctx.geo.dp_size:
            raise ctx.mesh_failure()
    elif ctx.geo.world_size % sp:
        raise mesh_failure(ctx.geo.world_size, sp)
    out = Params(
        sp=sp,
        budget_sp=budget_sp,
        dyn=dyn,
        budget=budget,
        micro=_micro(ctx, micro_k, dep_k, sp),
        rmpad=rmpad,
        missing=missing,
        keys=[micro_k, dyn_k, budget_k, sp_k],
        where=(WHERE if legacy else WHERE_ENGINE)[name],
        notes=notes,
        D=ctx.geo.world_size // sp,
        slice_sp=budget_sp if legacy and name == "ref_log_prob" else sp,
    )
    return megatron_params(ctx, name, out) if megatron else out
