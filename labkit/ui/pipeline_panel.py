"""Notebook 12's panel: TP, PP, VPP, CP, EP, the micro size and dynamic batch size over a Megatron config; every
change re-reads the layout (``labkit.rules.megatron_ranks.layout_check``), re-plans the step
(``labkit.plan.step.plan``) and redraws the micro-batches per DP rank, the update's pipeline schedule and the
micro-batches each stage keeps in flight (arithmetic only, no process)."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W

from labkit.config.keys import ACTOR, ARR
from labkit.config.messages import ConfigError
from labkit.plan.pipeline_schedule import pipeline_schedule, schedule_check
from labkit.rules.megatron_ranks import layout_check
from labkit.rules.parallel_layout import ParallelLayout
from labkit.ui import panel_parts as parts
from labkit.ui import pipeline_figures as pf
from labkit.ui.figure_style import specs

M = f"{ACTOR}.megatron"
SIZE_KEYS = {
    "TP": "tensor_model_parallel_size",
    "PP": "pipeline_model_parallel_size",
    "VPP (0: none)": "virtual_pipeline_model_parallel_size",
    "CP": "context_parallel_size",
    "EP": "expert_model_parallel_size",
}


UPDATE_ONLY = [
    f"{ARR}.rollout.log_prob_use_dynamic_bsz=false",
    f"{ARR}.ref.log_prob_use_dynamic_bsz=false",
]
"""The log-prob passes off the dynamic path: the panel reads the update only (their dynamic cuts cost 2/3 of a plan;
with no static micro size set they stop at once, which the update does not see)."""


def update_counts_per_mini(cfg: Any, lengths: Any) -> tuple[list[list[int]] | None, str]:
    """(per DP rank, the micro-batch count of each mini-batch of the update, "") from the planner, or (None, the
    error verl raises there). The log-prob passes are planned off the dynamic path (``UPDATE_ONLY``): they do not
    change the rows or the cut of the update."""
    from labkit.plan.step import plan

    trace = plan(cfg.copy().override(UPDATE_ONLY), lengths)
    err = (trace.summary.get("stage_errors") or {}).get("update_actor")
    if not err and not trace.at("update_actor"):  # a planner that stops at the first failing stage: plan it all
        trace = plan(cfg, lengths)
        err = (trace.summary.get("stage_errors") or {}).get("update_actor")
    if err:
        return None, f"{err['code']} {err['exc_type']}: {err['message']}"
    if not trace.at("update_actor"):  # verl stops at an earlier stage
        stop = trace.summary.get("first_error") or {}
        return None, f"the update never runs: {stop.get('code', '')} {stop.get('message', 'an earlier stage fails')}"
    first = [r for r in trace.at("update_actor") if r.extra.get("megatron", {}).get("pp", 0) == 0]
    per_dp: dict[int, list[int]] = {}
    for r in first:
        per_dp.setdefault(r.dp_rank, list(r.extra.get("ga_per_mini") or [len(r.micro_batches)]))
    return [per_dp[d] for d in sorted(per_dp)], ""


def update_counts(cfg: Any, lengths: Any) -> tuple[list[int] | None, str]:
    """(the first mini-batch's micro-batch count per DP rank, "") or (None, verl's error): one ``forward_backward``
    call of the update, the one the schedule figures draw."""
    counts, err = update_counts_per_mini(cfg, lengths)
    return ([c[0] for c in counts] if counts else None), err


def _card(text: str, ok: bool) -> str:
    color = "#54A24B" if ok else "#E45756"
    return f"<div style='border-left:4px solid {color};padding:4px 8px'>{html.escape(text)}</div>"


def megatron_panel(cfg: Any, lengths: Any = "long-reasoning") -> W.VBox:
    """Number boxes for the Megatron sizes and the micro size, a dynamic-bsz box; redraws on every change."""
    g = cfg.get
    boxes = {label: parts.int_box(label, g(f"{M}.{key}") or (0 if "VPP" in label else 1), f"{M}.{key}")
             for label, key in SIZE_KEYS.items()}  # fmt: skip
    micro = parts.int_box(
        "micro / GPU", g(f"{ACTOR}.ppo_micro_batch_size_per_gpu") or 1, "ppo_micro_batch_size_per_gpu"
    )
    dynamic = W.Checkbox(value=bool(g(f"{ACTOR}.use_dynamic_bsz")), description="use_dynamic_bsz", indent=False)
    card, area = W.HTML(), parts.FigureArea()
    cache: dict[tuple, tuple] = {}

    def redraw(_: object = None) -> None:
        overrides = [f"{ACTOR}.use_dynamic_bsz={str(dynamic.value).lower()}",
                     f"{ACTOR}.ppo_micro_batch_size_per_gpu={micro.value}"]  # fmt: skip
        for label, key in SIZE_KEYS.items():
            v = boxes[label].value
            overrides.append(f"{M}.{key}={'null' if 'VPP' in label and v <= 1 else v}")
            if key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
                overrides.append(f"actor_rollout_ref.ref.megatron.{key}={v}")
        key = tuple(overrides)
        if key not in cache:  # a setting seen before redraws from its plan at once
            try:
                c = cfg.copy().override(overrides)
                layout = ParallelLayout.from_config(c)
                bad = layout_check(layout)
                found = (None, f"{bad.error}: {bad.message} ({bad.arithmetic})") if bad else update_counts(c, lengths)
                cache[key] = (layout, *found)
            except (ConfigError, ValueError) as exc:
                cache[key] = (None, None, str(exc))
        layout, counts, err = cache[key]
        if counts is None:
            card.value = _card(err, False)
            area.clear()
            return
        m, pp = counts[0], layout.pp
        if sched_bad := schedule_check(pp, layout.vpp, m):
            card.value = _card(f"megatron-core: {sched_bad.error}: {sched_bad.message} ({sched_bad.arithmetic})", False)
            area.clear()
            return
        sched = pipeline_schedule(pp, layout.vpp, m)
        card.value = _card(
            f"W = {layout.world_size}, D = W/(TP·PP·CP) = {layout.dp_size}; {m} micro-batches per DP rank in the "
            f"first mini-batch; {sched.function}; bubble {sched.bubble_fraction:.1%}",
            True,
        )
        with specs():
            area.figures([
                pf.micro_batches_per_dp({"first mini-batch of the update": counts}),
                pf.schedule_timeline(sched),
                pf.in_flight_per_stage(sched),
            ])  # fmt: skip

    for w in [*boxes.values(), micro, dynamic]:
        w.observe(redraw, names="value")
    redraw()
    panel = W.VBox([W.HBox([parts.column(list(boxes.values())), parts.column([micro, dynamic])]), card, area.out])
    panel.figure_area, panel.boxes, panel.micro, panel.dynamic, panel.card = area, boxes, micro, dynamic, card
    return panel
