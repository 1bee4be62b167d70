"""One RL step's memory under the Megatron engine, per phase, from a config (and, when lengths are given, the plan's
micro-batches): the phases ``labkit memory`` answers with, each one the worst pipeline stage's.

Each training phase is priced on every pipeline stage (``labkit.memory.megatron_memory``) with the largest micro-batch
a GPU of that stage feeds and the micro-batch count that sets the schedule's in-flight activations; the phase's
instants are named ``stage k: <instant>``, so its peak names the stage that runs out first. Generate keeps the
rollout engine's terms (the rollout does not depend on the training engine) beside the Megatron model states that
stay on the GPU. Sizes: the token budget × CP spread over CP ranks (dynamic), or m rows at full width padded to the
sequence alignment (static); the micro-batch count from the rows per DP rank.
"""

from __future__ import annotations

from typing import Any

from labkit.config.keys import ACTOR, ARR, REF
from labkit.config.messages import ConfigError
from labkit.memory.headroom import add_headroom
from labkit.memory.megatron_memory import Recompute, Residency, StageInputs, megatron_memory, residents
from labkit.memory.megatron_params import OptimizerBytes, cpu_offloaded
from labkit.memory.phase_records import Phase
from labkit.memory.phases import generate
from labkit.memory.settings import MemorySettings
from labkit.memory.settings_keys import dtype_bytes, raw_value
from labkit.plan.context import Ctx
from labkit.plan.megatron_passes import padded_row, sequence_alignment
from labkit.plan.roles import params
from labkit.rules.failures import StageFailure
from labkit.rules.geometry import BatchGeometry, ceil_div
from labkit.rules.run import as_run

ENGINE_TERMS = ("rollout_weights", "rollout_activations", "kv_cache")
_ROLE = {
    "old_log_prob": ACTOR,
    "ref_log_prob": REF,
    "update_actor": ACTOR,
    "values": "critic",
    "update_critic": "critic",
}


def recompute_of(cfg: Any, phase: str) -> Recompute:
    """The recompute settings of the role that runs ``phase`` (``<role>.megatron.override_transformer_config``)."""
    tc = f"{_ROLE[phase]}.megatron.override_transformer_config"
    return Recompute(
        granularity=cfg.get(f"{tc}.recompute_granularity"),
        method=cfg.get(f"{tc}.recompute_method"),
        num_layers=cfg.get(f"{tc}.recompute_num_layers"),
        modules=tuple(cfg.get(f"{tc}.recompute_modules") or ()),
    )


def optimizer_of(cfg: Any, role: str) -> OptimizerBytes:
    """The role's optimizer bytes from ``<role>.optim`` and its ``override_optimizer_config`` (megatron-core's
    OptimizerConfig fields verl passes through): CPU offload and its fraction, the precision-aware dtypes.
    ConfigError for a fraction outside [0, 1] or a dtype verl would not read."""
    base, over = f"{role}.optim", f"{role}.optim.override_optimizer_config"

    def value(name: str, default: Any = None) -> Any:
        """The override's field, else (a field 0.9.1's McoreOptimizerConfig has) the role's own optim key."""
        own = raw_value(cfg, f"{base}.{name}", default) if name in OWN_FIELDS else default
        return raw_value(cfg, f"{over}.{name}", own)

    def flag(name: str) -> bool:
        return str(value(name, False)).strip().lower() in ("true", "1")

    offload = flag("optimizer_cpu_offload")
    try:
        fraction = float(value("optimizer_offload_fraction", 0.0))
    except (TypeError, ValueError):
        raise ConfigError(
            f"'{over}.optimizer_offload_fraction' is {value('optimizer_offload_fraction')!r}; a number"
        ) from None
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(
            f"'{over}.optimizer_offload_fraction' is {fraction}; it is the share of the optimizer megatron-core moves "
            "to the CPU, from 0 to 1"
        )
    aware = flag("use_precision_aware_optimizer")
    dtypes = {n: _dtype(cfg, base, over, n) if aware else 4 for n in DTYPES}
    if offload:
        return cpu_offloaded(fraction, aware, dtypes["main_grads_dtype"])
    remainders = aware and str(value("store_param_remainders", True)).lower() != "false"
    main = 2 if remainders and dtypes["main_params_dtype"] == 4 else dtypes["main_params_dtype"]
    return OptimizerBytes(
        main=main,
        exp_avg=dtypes["exp_avg_dtype"],
        exp_avg_sq=dtypes["exp_avg_sq_dtype"],
        grad=dtypes["main_grads_dtype"],
    )


DTYPES = ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "main_grads_dtype")
OWN_FIELDS = ("use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype", "main_grads_dtype")
"""The precision-aware optimizer's fields 0.9.1's ``McoreOptimizerConfig`` has as keys of its own (the rest go
through ``override_optimizer_config``)."""


def _dtype(cfg: Any, base: str, over: str, name: str) -> int:
    own = dtype_bytes(cfg, f"{base}.{name}", 4) if name in OWN_FIELDS else 4
    return dtype_bytes(cfg, f"{over}.{name}", own)


def residency_of(cfg: Any, s: MemorySettings) -> Residency:
    """Which models share the GPU and what each offloads (``<role>.megatron.param_offload``/``optimizer_offload``)."""
    g = cfg.get
    return Residency(
        optimizer=optimizer_of(cfg, ACTOR),
        critic_optimizer=optimizer_of(cfg, "critic"),
        param_offload=bool(g(f"{ACTOR}.megatron.param_offload")),
        optimizer_offload=bool(g(f"{ACTOR}.megatron.optimizer_offload")),
        need_ref=s.need_ref,
        ref_param_offload=bool(g(f"{REF}.megatron.param_offload")),
        need_critic=s.need_critic,
        critic_param_offload=bool(g("critic.megatron.param_offload")),
        critic_optimizer_offload=bool(g("critic.megatron.optimizer_offload")),
        lora=s.lora,
    )


def config_inputs(cfg: Any, geo: BatchGeometry, phase: str, s: MemorySettings) -> tuple[StageInputs, str]:
    """The worst micro-batch of ``phase`` on one GPU from the config alone (every row at full width), and how it
    was sized."""
    layout = geo.parallel
    p = params(Ctx(cfg=cfg, geo=geo, dispatch="mesh", lengths=None), phase)
    rows = max(1, geo.samples // max(geo.dp_size, 1))
    if phase.startswith("update"):
        mini = cfg.get(f"{ARR}.actor.ppo_mini_batch_size" if phase == "update_actor" else "critic.ppo_mini_batch_size")
        rows = max(1, min(rows, mini * geo.rollout_n // max(geo.dp_size, 1)))
    row = padded_row(geo.width, sequence_alignment(layout))
    if p.dyn and p.budget:
        budget = p.budget * layout.cp
        per_micro = max(1, min(rows, budget // geo.width))
        how = f"dynamic: budget {p.budget:,} × CP {layout.cp} = {budget:,} tokens, {per_micro} full-width rows"
    else:
        per_micro = max(1, min(rows, p.micro or 1))
        how = f"static: {per_micro} rows × width {geo.width:,}"
    tokens = per_micro * row // layout.cp
    how += f", padded to {sequence_alignment(layout)} and split over CP {layout.cp}"
    inputs = StageInputs(tokens, ceil_div(rows, per_micro), recompute_of(cfg, phase), _entropy(phase, s))
    return inputs, how


def trace_inputs(cfg: Any, trace: Any, phase: str, s: MemorySettings) -> StageInputs | None:
    """The largest micro-batch any GPU feeds in ``phase`` of a plan (tokens per GPU after padding and the CP split)
    and its largest micro-batch count per mini-batch (update) or call (forward); None without micro-batches."""
    tokens, count = 0, 0
    for rec in trace.at(phase):
        per_gpu = rec.extra.get("tokens_per_gpu") or []
        tokens = max(tokens, *per_gpu, 0)
        count = max(count, *(rec.extra.get("ga_per_mini") or [rec.n_micro]), 0)
    if not tokens or not count:
        return None
    return StageInputs(tokens, count, recompute_of(cfg, phase), _entropy(phase, s))


def _entropy(phase: str, s: MemorySettings) -> bool:
    return phase == "old_log_prob" or (phase == "update_actor" and s.update_entropy)


def megatron_phases(cfg: Any, s: MemorySettings, names: list[str], trace: Any = None) -> dict[str, Phase]:
    """Every phase of ``names`` under Megatron: generate with the Megatron model states that stay on the GPU, and
    each training phase as its worst stage (instants ``stage k: …``; ``info['stage_peaks']`` per stage).
    ConfigError for a shape or setting the Megatron memory model does not price (said, never guessed)."""
    try:
        return _megatron_phases(cfg, s, names, trace)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"Megatron memory not priced: {exc} (labkit check and plan still answer)") from None


def _megatron_phases(cfg: Any, s: MemorySettings, names: list[str], trace: Any) -> dict[str, Phase]:
    run = as_run(cfg)
    geo = run.geometry
    layout = geo.parallel
    r = residency_of(run, s)
    passes, hows = {}, {}
    for name in names:
        if name == "generate":
            continue
        got = trace_inputs(run, trace, name, s) if trace is not None else None
        if got is None:
            try:
                got, hows[name] = config_inputs(run, geo, name, s)
            except StageFailure:  # verl stops before this pass (a micro size it cannot use): nothing to price
                continue
        else:
            hows[name] = "from the plan's micro-batches (largest on any GPU, after padding and the CP split)"
        passes[name] = got
    mm = megatron_memory(s.model, layout, passes, r, s.gpu_bytes)
    out: dict[str, Phase] = {}
    for name in names:
        if name == "generate":
            out[name] = _generate(s, layout, r)
        elif name in passes:
            out[name] = _worst_stage(name, {k: mm.phases[k][name] for k in mm.phases}, s)
            out[name].info["micro_batch"] = hows[name]
    return out


def _worst_stage(name: str, by_stage: dict[int, Phase], s: MemorySettings) -> Phase:
    """One phase over all stages: every stage's instants, named by stage, with the headroom terms added."""
    instants = {f"stage {k}: {inst}": dict(terms) for k, p in by_stage.items() for inst, terms in p.instants.items()}
    add_headroom(s, instants)
    peaks = {k: max(sum(t.values()) for i, t in instants.items() if i.startswith(f"stage {k}:")) for k in by_stage}
    worst = max(peaks, key=peaks.get)
    info = {**by_stage[worst].info, "stage_peaks": peaks, "worst_stage": worst, "pipeline_stages": len(by_stage)}
    return Phase(name, instants, info)


def _generate(s: MemorySettings, layout: Any, r: Residency) -> Phase:
    """The rollout's engine terms (its own mesh, as under FSDP) beside the Megatron model states of the stage that
    keeps the most on the GPU."""
    fsdp = generate(s)
    engine_terms = {k: v for k, v in fsdp.instants["engine"].items() if k in ENGINE_TERMS}
    best: dict[str, int] = {}
    for stage in range(layout.pp):
        states = residents(s.model, layout, stage, "generate", r)
        if sum(states.values()) >= sum(best.values()):
            best = states
    instants = {"engine": {**best, **engine_terms}}
    add_headroom(s, instants)
    info = {k: v for k, v in fsdp.info.items() if k != "not_modelled"}  # FSDP's notes on its training passes
    return Phase("generate", instants, info)
