"""The memory of a whole step, per phase and per GPU: micro-batch shapes from the config (worst case, every sample
at full width) or from a planned/live ``StepTrace`` (the real tokens of every micro-batch), and
``fill_bytes_predicted`` that writes each rank record's peak into the trace.

Static micro-batches count rows × padded width (packed: the real tokens); dynamic ones the token budget × SP, split
over the SP ranks, so a GPU feeds at most the budget (``verl/workers/engine/utils.py: prepare_micro_batches``:
``max_token_len = max_token_len_per_gpu * sp``). The legacy budget is a target, not a cap (Karmarkar-Karp balances
workload): only a trace with real lengths shows the micro-batch that overflows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.config.keys import ACTOR, REF, ROLLOUT
from labkit.memory.headroom import add_headroom
from labkit.memory.megatron_step import megatron_phases
from labkit.memory.phase_records import PassShape, Phase
from labkit.memory.phases import forward_pass, generate, update_pass
from labkit.memory.settings import MemorySettings
from labkit.plan.context import Ctx
from labkit.plan.roles import params
from labkit.rules.failures import StageFailure
from labkit.rules.geometry import ceil_div
from labkit.rules.run import as_run
from labkit.trace import RankRecord, StepTrace

# phase -> (rows per micro-batch key, dynamic flag key, token budget key, SP key)
PASS_KEYS: dict[str, tuple[str, str, str, str]] = {
    "old_log_prob": (
        f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        f"{ROLLOUT}.log_prob_use_dynamic_bsz",
        f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
        f"{ACTOR}.ulysses_sequence_parallel_size",
    ),
    "ref_log_prob": (
        f"{REF}.log_prob_micro_batch_size_per_gpu",
        f"{REF}.log_prob_use_dynamic_bsz",
        f"{REF}.log_prob_max_token_len_per_gpu",
        f"{REF}.ulysses_sequence_parallel_size",
    ),
    "values": (
        "critic.forward_micro_batch_size_per_gpu",
        "critic.use_dynamic_bsz",
        "critic.forward_max_token_len_per_gpu",
        "critic.ulysses_sequence_parallel_size",
    ),
    "update_critic": (
        "critic.ppo_micro_batch_size_per_gpu",
        "critic.use_dynamic_bsz",
        "critic.ppo_max_token_len_per_gpu",
        "critic.ulysses_sequence_parallel_size",
    ),
    "update_actor": (
        f"{ACTOR}.ppo_micro_batch_size_per_gpu",
        f"{ACTOR}.use_dynamic_bsz",
        f"{ACTOR}.ppo_max_token_len_per_gpu",
        f"{ACTOR}.ulysses_sequence_parallel_size",
    ),
}
ORDER = ("generate", "old_log_prob", "ref_log_prob", "values", "update_critic", "update_actor")


def phase_names(s: MemorySettings) -> list[str]:
    """The phases of this step, in the order of ``RayPPOTrainer.fit`` (the trace's stage names)."""
    skip = {"ref_log_prob"} if not s.need_ref else set()
    skip |= {"values", "update_critic"} if not s.need_critic else set()
    return [p for p in ORDER if p not in skip]


def config_shape(cfg: Any, phase: str, sample_tokens: int | None = None) -> tuple[PassShape, str]:
    """The largest micro-batch of ``phase`` on one GPU from the config alone, and how it was sized: every sample at
    full width, or at ``sample_tokens`` (packed rows; a padded row is full width whatever its sample). The keys each
    profile reads are the planner's (``labkit.plan.roles.params``: the engine's old log-prob follows
    actor.use_dynamic_bsz, its critic is dynamic on sp=1, legacy normalises deprecated global sizes)."""
    run = as_run(cfg)
    geo = run.geometry
    try:
        p = params(Ctx(cfg=run, geo=geo, dispatch="mesh", lengths=None), phase)
    except StageFailure:  # a (dp, sp) mesh torch cannot build: verl stops before this pass; size it as sp = 1
        p = None
    sp = max(1, p.sp if p is not None else 1)
    per_rank = max(1, ceil_div(geo.samples, max(1, geo.world_size // sp)))
    if phase.startswith("update"):  # an update's micro-batches are cut from one mini-batch: M·n over the DP ranks
        mini = run.get(f"{'critic' if phase == 'update_critic' else ACTOR}.ppo_mini_batch_size")
        per_rank = min(per_rank, max(1, mini * geo.rollout_n // max(1, geo.world_size // sp)))
    packed = p is None or p.rmpad
    row = min(sample_tokens, geo.width) if sample_tokens and packed else geo.width
    if p is not None and p.dyn and p.budget:
        tokens = min(p.budget * p.budget_sp, per_rank * row)
        how = f"dynamic: budget {p.budget:,} × sp {p.budget_sp} over {sp} SP rank{'s' if sp > 1 else ''}"
        if run.profile == "legacy":
            how += " (legacy: a target, a micro-batch can exceed it; --lengths shows by how much)"
        return PassShape(rows=max(1, tokens // row), tokens=ceil_div(tokens, sp)), how
    rows = min(max(1, (p.micro if p is not None else None) or 1), per_rank)
    width = f"width {geo.width:,}" if row == geo.width else f"{row:,} tokens each (packed)"
    how = f"static: {rows} rows × {width}" + (f" over {sp} SP ranks" if sp > 1 else "")
    real = rows * min(sample_tokens, geo.width) if sample_tokens and not packed else None
    return PassShape(rows=rows, tokens=ceil_div(rows * row, sp), real_tokens=real), how


def record_shape(rec: RankRecord, width: int, sp: int) -> PassShape | None:
    """The largest micro-batch a rank record holds (tokens as fed, per SP rank); None without micro-batches."""
    best: PassShape | None = None
    for mb in rec.micro_batches:
        fed = mb.padded_tokens if mb.padded_tokens is not None else mb.tokens
        fed = mb.rows * width if fed is None else fed
        real = mb.tokens if mb.padded_tokens is not None and mb.tokens is not None else None
        shape = PassShape(rows=mb.rows, tokens=ceil_div(fed, sp), real_tokens=real)
        if best is None or shape.tokens > best.tokens:
            best = shape
    return best


def phase_of(s: MemorySettings, name: str, shape: PassShape | None) -> Phase:
    """One phase's memory on one GPU."""
    if name == "generate":
        phase = generate(s)
    else:
        assert shape is not None
        phase = update_pass(s, name, shape) if name.startswith("update") else forward_pass(s, name, shape)
    add_headroom(s, phase.instants)
    return phase


def step_phases(cfg: Any, s: MemorySettings, sample_tokens: int | None = None) -> dict[str, Phase]:
    """Every phase of the step from the config or its run alone (worst case: samples at full width;
    ``sample_tokens``: every sample that long); Megatron's per stage (``labkit.memory.megatron_step``, full width)."""
    run = as_run(cfg)
    if run.is_megatron:
        return megatron_phases(run, s, phase_names(s))
    out = {}
    for name in phase_names(s):
        shape, how = (None, "") if name == "generate" else config_shape(run, name, sample_tokens)
        out[name] = phase_of(s, name, shape)
        if how:
            out[name].info["micro_batch"] = how
    return out


def trace_phases(tr: StepTrace, cfg: Any, s: MemorySettings) -> dict[str, Phase]:
    """Every phase from a trace's micro-batches (the worst GPU of each stage); the config where a stage has none."""
    run = as_run(cfg)
    geo = run.geometry
    if geo.parallel.is_megatron:
        return megatron_phases(run, s, phase_names(s), tr)
    out = {}
    for name in phase_names(s):
        if name == "generate":
            out[name] = phase_of(s, name, None)
            continue
        sp = max(1, run.get(PASS_KEYS[name][3]))
        shapes = [x for x in (record_shape(r, geo.width, sp) for r in tr.at(name)) if x is not None]
        if not shapes:
            shape, how = config_shape(run, name)
        else:
            shape, how = max(shapes, key=lambda x: x.tokens), "from the plan's micro-batches (largest on any GPU)"
        out[name] = phase_of(s, name, shape)
        out[name].info["micro_batch"] = how
        if shapes:  # the typical case: the median micro-batch by tokens, beside the worst one
            typical = sorted(shapes, key=lambda x: x.tokens)[len(shapes) // 2]
            out[name].info["typical_tokens"] = typical.tokens
            out[name].info["typical_peak_bytes"] = phase_of(s, name, typical).peak_bytes
    return out


def fill_bytes_predicted(tr: StepTrace, cfg: Any, s: MemorySettings, phases: Sequence[str] | None = None) -> StepTrace:
    """Write each rank record's predicted peak (its own largest micro-batch) into ``bytes_predicted``, in place;
    generate gets the engine phase, stages without memory of their own (or not in ``phases``) stay None."""
    run = as_run(cfg)
    geo = run.geometry
    names = set(phase_names(s)) & (set(phases) if phases is not None else set(ORDER))
    if geo.parallel.is_megatron:  # each rank gets its pipeline stage's peak
        by_phase = megatron_phases(run, s, sorted(names), tr)
        for rec in tr.ranks:
            p = by_phase.get(rec.stage)
            if p is not None:
                stage = (rec.extra.get("megatron") or {}).get("pp")
                rec.bytes_predicted = p.info.get("stage_peaks", {}).get(stage, p.peak_bytes)
        return tr
    gen = phase_of(s, "generate", None).peak_bytes
    for rec in tr.ranks:
        if rec.stage not in names:
            continue
        if rec.stage == "generate":
            rec.bytes_predicted = gen
            continue
        sp = max(1, run.get(PASS_KEYS[rec.stage][3]))
        shape = record_shape(rec, geo.width, sp) or config_shape(run, rec.stage)[0]
        rec.bytes_predicted = phase_of(s, rec.stage, shape).peak_bytes
    return tr
