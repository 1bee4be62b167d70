"""The pipeline at a glance for one config: what every rank holds at every stage of one training step.

Pure arithmetic, no processes: ``plan(cfg, lengths)`` fills a ``labkit.trace.StepTrace`` (source="plan") with one
StageRecord per stage of verl's ``RayPPOTrainer.fit`` and one RankRecord per GPU rank and stage, in the same shape a
live run records, so ``labkit.trace.compare`` checks prediction against observation. Stage builders live in
``rollout_stages`` (driver, rollout, balance) and ``train_stages`` (forward passes, updates); collective names in
``labkit.rules.collectives.COLLECTIVES``. When verl would stop (an E-code of docs/errors.md), the stage carries the error and the
plan goes on with what it can; ``summary`` also holds ``labkit.validate.report``'s findings.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any

from labkit.config.messages import ConfigError
from labkit.plan import rollout_stages as S
from labkit.plan import train_stages as T
from labkit.plan import v1_stages as V
from labkit.plan.context import Ctx
from labkit.plan.megatron_passes import MICROBATCH_GROUP, layout_groups, megatron_summary, update_schedule, vpp_group
from labkit.rules.collectives import COLLECTIVES
from labkit.rules.failures import StageFailure
from labkit.rules.geometry import ARR
from labkit.rules.megatron_ranks import layout_check
from labkit.rules.run import Run, as_run
from labkit.rules.v1_loop import LOOP_TITLES
from labkit.trace import StepTrace

DISPATCH = ("mesh", "all_gather")
__all__ = ["plan", "DISPATCH", "COLLECTIVES", "findings_of"]


def findings_of(cfg: Any, max_seq_len: int | None = None) -> tuple[list[dict] | None, Any]:
    """``labkit.validate.report.check(cfg)`` as plain dicts (None when labkit.validate.report is not available), and the report."""
    try:
        from labkit.validate.report import check
    except ImportError:
        return None, None
    report = check(cfg, max_seq_len=max_seq_len)
    return [asdict(f) if is_dataclass(f) else dict(vars(f)) for f in report.findings], report


def _steps(run: Run) -> list[tuple[str, Callable[[Ctx, StepTrace], None]]]:
    """The stages of one step in the order the run's trainer loop runs them (legacy and v0: RayPPOTrainer.fit; v1:
    PPOTrainer._step_once); at a step before ``trainer.critic_warmup`` the actor's update is skipped, as both loops
    skip it."""
    loop, actor_updates = run.loop, run.geometry.actor_updates
    if loop == "v1":
        steps = [
            ("dataloader", V.dataloader),
            ("agent_loop", V.agent_loop),
            ("generate", V.generate),
            ("reward", V.reward),
            ("replay_buffer", V.replay_buffer),
            ("padding", V.padding),
            ("balance", V.balance),
            ("old_log_prob", lambda c, t: T.forward_stage(c, t, "old_log_prob")),
        ]
    else:
        steps = [
            ("dataloader", S.dataloader),
            ("repeat", S.repeat),
            *([("agent_loop", S.agent_loop)] if run.geometry.agent_loop else []),
            ("generate", S.generate),
            ("balance", S.balance),
            ("reward", S.reward),
            ("old_log_prob", lambda c, t: T.forward_stage(c, t, "old_log_prob")),
        ]
    if run.need_reference_policy:
        steps.append(("ref_log_prob", lambda c, t: T.forward_stage(c, t, "ref_log_prob")))
    if run.need_critic:
        steps.append(("values", lambda c, t: T.forward_stage(c, t, "values")))
    steps.append(("advantage", V.advantage if loop == "v1" else S.advantage))
    if run.need_critic:
        steps.append(("update_critic", lambda c, t: T.update_stage(c, t, "update_critic")))
    steps.append(
        ("update_actor", (lambda c, t: T.update_stage(c, t, "update_actor")) if actor_updates else T.no_update)
    )
    return steps


def _same(values: list) -> Any:
    """One value when all ranks agree, else the per-rank list (None when there are no ranks)."""
    if not values:
        return None
    return values[0] if all(v == values[0] for v in values) else values


def _summarize(ctx: Ctx, tr: StepTrace) -> None:
    s = tr.summary
    s.update(
        {
            "profile": ctx.profile,
            "loop": ctx.geo.loop,
            "loop_title": LOOP_TITLES[ctx.geo.loop],
            "dispatch": ctx.dispatch,
            "B": ctx.geo.prompts,
            "n": ctx.geo.rollout_n,
            "samples": ctx.geo.samples,
            "generated_samples": ctx.geo.generated_samples,
            "padding_rows": ctx.geo.padding_rows,
            "required_multiple": ctx.geo.required_multiple,
            "W": ctx.geo.world_size,
            "D": ctx.geo.dp_size or None,
            "sp": ctx.geo.ulysses_sp,
            "tp": ctx.geo.rollout_tp,
            "infer_tp": ctx.geo.infer_tp,
            "infer_pp": ctx.geo.rollout_pp,
            "R": ctx.geo.rollout_replicas or None,
            "A": ctx.geo.agent_workers,
            "width": ctx.geo.width,
            "rmpad": ctx.geo.remove_padding,
            "engine": ctx.geo.parallel.engine,
        }
    )
    if ctx.geo.parallel.is_megatron:
        s["megatron"] = megatron_summary(ctx.geo.parallel)
        if ctx.geo.dp_size and layout_check(ctx.geo.parallel) is None:  # else megatron-core stops at worker init
            s["megatron"]["groups"] = layout_groups(ctx.geo.parallel)
            first = next((r for r in tr.at("update_actor") if r.rank == 0), None)
            per_mini = first.extra.get("ga_per_mini") if first is not None else None
            if per_mini:  # rank 0's first mini-batch (a dynamic count can differ by mini-batch: see the ranks)
                group = vpp_group(ctx.geo.parallel, ctx.get(f"{ARR}.actor.megatron.{MICROBATCH_GROUP}"))
                s["megatron"]["schedule"] = update_schedule(ctx.geo.parallel, per_mini[0], group)
    upd = s.get("update", {}).get("update_actor", {})
    s["mini_normalized"] = upd.get("mini_normalized")
    s["mini_batches"] = upd.get("mini_batches")
    s["mini_batches_per_epoch"] = len(upd["mini_batches"]) if upd else None
    s["ga"] = upd.get("ga")
    s["micro_batches_run"] = upd.get("micro_batches_run")
    first = next(iter(tr.at("update_actor")), None)
    s["ga_per_mini"] = first.extra.get("ga_per_mini") if first is not None and first.micro_batches else None
    s["optimizer_steps_per_step"] = upd.get("optimizer_steps")
    s["loss_scale"] = upd.get("loss_scale")
    for stage in ("old_log_prob", "ref_log_prob", "values"):
        recs = tr.at(stage)
        if recs and any(r.micro_batches for r in recs):
            s[f"{stage}_micro_batches_per_rank"] = _same([r.n_micro for r in recs])
    s["log_prob_micro_batches_per_rank"] = s.get("old_log_prob_micro_batches_per_rank")
    if ctx.lengths:
        total = sum(ctx.lengths)
        tok = {
            "total": total,
            "min_len": min(ctx.lengths),
            "max_len": max(ctx.lengths),
            "mean_len": total / ctx.geo.samples,
            "padded_total": ctx.geo.samples * ctx.geo.width,
        }
        bal = [r for r in tr.at("balance") if r.sp_rank == 0]
        if bal:
            per = [r.tokens for r in bal]
            tok.update(per_dp_rank=per, per_dp_rank_min=min(per), per_dp_rank_max=max(per))
        s["tokens"] = tok
        if ctx.v1:  # as v1 logs them: perf/total_num_tokens counts the 128-token padding rows, data metrics do not
            s["v1_metrics"] = {
                "perf/total_num_tokens": total,
                "padding_tokens": total - sum(ctx.lengths[i] for i, row in enumerate(ctx.rows) if row is not None),
                "global_seqlen": "measured on the padded batch before reordering (padding rows 128 tokens each)",
                "data_metrics": "response_length/*, critic/score/* and the advantages leave the padding rows out",
            }


class PlanTooLarge(ConfigError):
    """The step is too large to follow per rank in bounded time; the message keeps the arithmetic."""


def plan(
    cfg: Any,
    lengths: Sequence[int] | str | None = None,
    *,
    dispatch: str = "mesh",
    seed: int = 0,
    completion_order: Sequence[int] | None = None,
    global_step: int = 1,
    failed_sessions: Sequence[int] = (),
) -> StepTrace:
    """Predict one training step of ``cfg`` (a ``VerlConfig``, resolved once here, or its ``Run``) per stage and per rank.

    ``lengths``: None (rows only), B·n explicit token counts, or a profile name of ``data/length_profiles.json``
    drawn with ``seed``. ``dispatch``: "mesh" (nd dispatch, v0.6+) or "all_gather" (≤v0.5 DP_COMPUTE_PROTO + TP/SP
    all-gather). ``completion_order`` (v1 only): the trajectory indices p·n + session in the order they finished, the
    batch's row order before balancing (default: submission order; with failed sessions, of the survivors).
    ``global_step``: the trainer's step (1 = the first): the actor's update runs from ``trainer.critic_warmup`` on
    and v1 pads to the step's multiple. ``failed_sessions`` (v1 only): trajectory indices whose agent-loop session
    failed; the replay buffer trains on the survivors (E49 when there are none). Bad lengths, dispatch, step or
    sessions raise ValueError; a config verl rejects still gives a trace; a step larger than the planner follows
    (``BatchGeometry.too_large_to_plan``) raises PlanTooLarge, with the arithmetic.
    """
    if dispatch not in DISPATCH:
        raise ValueError(f"dispatch must be one of {list(DISPATCH)}, got {dispatch!r}")
    collecting = gc.isenabled()
    gc.disable()  # a plan allocates ~10^5 acyclic objects; cyclic collections in between cost ~10% for nothing
    try:
        return _plan(cfg, lengths, dispatch, seed, completion_order, global_step, failed_sessions)
    finally:
        if collecting:
            gc.enable()


def _plan(
    cfg: Any,
    lengths: Sequence[int] | str | None,
    dispatch: str,
    seed: int,
    completion_order: Sequence[int] | None,
    global_step: int = 1,
    failed_sessions: Sequence[int] = (),
) -> StepTrace:
    run = as_run(cfg, global_step, failed_sessions)
    geo = run.geometry
    too_large = geo.too_large_to_plan()
    if too_large:
        raise PlanTooLarge(too_large)
    generated = geo.lengths(lengths, seed)
    ctx = Ctx(cfg=run, geo=geo, dispatch=dispatch, lengths=generated)
    if geo.loop == "v1":
        V.arrange_rows(ctx, generated, completion_order)
    elif completion_order is not None:
        raise ValueError("completion_order applies to the v1 loop only (trainer.use_v1=true, engine profile)")
    tr = StepTrace(profile=run.profile, source="plan")
    for name, step in _steps(run):
        try:
            step(ctx, tr)
        except StageFailure as fail:
            ctx.errors[name] = fail.as_dict()
            if fail.code == "E49":  # the driver raises: nothing after the replay buffer runs
                break
            tr.ranks = [r for r in tr.ranks if r.stage != name]
            for rec in tr.stages:
                if rec.name == name:
                    stop = f"verl stops here: {fail.exc_type} {fail.message}"
                    rec.note = stop + (f"; {rec.note}" if rec.note else "")
    _summarize(ctx, tr)
    tr.row_lengths = None if ctx.lengths is None else list(ctx.lengths)
    tr.summary["stage_errors"] = ctx.errors
    tr.summary["global_step"], tr.summary["failed_sessions"] = geo.global_step, list(geo.failed_sessions)
    try:
        findings, report = findings_of(run, None if ctx.lengths is None else max(ctx.lengths))
    except Exception as exc:  # noqa: BLE001 - a validate bug must not hide the plan; shown in the summary
        findings, report = None, None
        tr.summary["validate_crashed"] = f"{type(exc).__name__}: {exc}"
    tr.summary["findings"] = findings
    tr.summary["validate_ok"] = None if report is None else bool(report.ok)
    first = None if report is None else report.first_error
    tr.summary["first_error"] = None if first is None else (asdict(first) if is_dataclass(first) else vars(first))
    tr.summary["ok"] = tr.summary["validate_ok"] is not False and not ctx.errors
    return tr
