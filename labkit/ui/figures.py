"""Plotly figures over ``StepTrace``: the same functions draw a plan, a live trace, or both side by side."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from labkit.trace import StepTrace
from labkit.ui.figure_style import PALETTE, Figure, hline_spec, plain_figure, set_layout

UNITS = {
    "rows": "rows (samples)",
    "tokens": "real tokens",
    "padded_tokens": "tokens through the forward",
    "workload": "KK workload (24576·L + L²)",
    "n_micro": "micro-batches",
}


def _value(rec, metric: str):
    return rec.n_micro if metric == "n_micro" else getattr(rec, metric)


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    return set_layout(fig, title, x, y)


def pipeline_funnel(trace: StepTrace) -> go.Figure:
    """Global rows at each stage, with the per-rank share as hover text."""
    stages = trace.stages
    bar = {
        "type": "bar",
        "x": [s.name for s in stages],
        "y": [s.global_rows for s in stages],
        "text": [f"{s.global_rows} {s.unit}" for s in stages],
        "textposition": "outside",
        "hovertext": [f"{s.title}<br>{s.formula}<br>per rank: {s.per_rank_rows}" for s in stages],
        "marker": {"color": PALETTE[0]},
    }
    return plain_figure([bar], f"One training step ({trace.profile} profile, {trace.source})", "stage", "global rows")


def rank_bars(trace: StepTrace, stage: str, metric: str = "rows") -> go.Figure:
    """One bar per rank for one stage (rows, tokens, padded tokens, workload or micro-batch count)."""
    recs = trace.at(stage)
    values = [_value(r, metric) for r in recs]
    bar = {
        "type": "bar",
        "x": [f"rank {r.rank}" for r in recs],
        "y": values,
        "marker": {"color": PALETTE[1]},
        "text": [str(v) for v in values],
        "textposition": "auto",
    }
    unit = UNITS.get(metric, metric)
    return plain_figure([bar], f"{stage}: {unit} per rank", "global rank", unit)


def micro_batch_stack(trace: StepTrace, stage: str, metric: str = "tokens", budget: int | None = None) -> go.Figure:
    """Stacked micro-batches per rank (tokens or rows), with the token budget as a dashed line."""
    recs = trace.at(stage)
    depth = max((r.n_micro for r in recs), default=0)
    xs = [f"rank {r.rank}" for r in recs]
    bars = [
        {
            "type": "bar",
            "x": xs,
            "y": [getattr(r.micro_batches[i], metric) if i < r.n_micro else 0 for r in recs],
            "name": f"micro {i}",
            "marker": {"color": PALETTE[i % len(PALETTE)]},
        }
        for i in range(depth)
    ]
    line = hline_spec(budget, f"budget {budget} tokens", color=None) if budget is not None else {}
    title, unit = f"{stage}: micro-batches per rank", UNITS.get(metric, metric)
    return plain_figure(bars, title, "global rank", unit, barmode="stack", **line)


def compare_bars(predicted: StepTrace, observed: StepTrace, stage: str, metric: str = "rows") -> go.Figure:
    """Prediction next to observation, per rank, for one stage."""
    fig = Figure()
    for tr, name, color in ((predicted, "predicted (plan)", PALETTE[0]), (observed, "observed (live)", PALETTE[1])):
        recs = tr.at(stage)
        fig.add_trace(
            go.Bar(
                x=[f"rank {r.rank}" for r in recs], y=[_value(r, metric) for r in recs], name=name, marker_color=color
            )
        )
    fig.update_layout(barmode="group")
    return _layout(
        fig, f"{stage}: predicted vs observed {UNITS.get(metric, metric)}", "global rank", UNITS.get(metric, metric)
    )


def before_after(before: Sequence[float], after: Sequence[float], what: str = "tokens") -> go.Figure:
    """Per-DP-rank totals before and after a rebalancing (e.g. _balance_batch), with max/min in the legend."""
    bars = []
    for ys, name, color in ((before, "before", PALETTE[3]), (after, "after", PALETTE[2])):
        spread = max(ys) / max(min(ys), 1) if len(ys) else 0.0
        bars.append(
            {
                "type": "bar",
                "x": [f"dp {i}" for i in range(len(ys))],
                "y": list(ys),
                "name": f"{name} (max/min {spread:.3f})",
                "marker": {"color": color},
            }
        )
    return plain_figure(bars, f"{what} per DP rank, before vs after", "DP rank", what, barmode="group")


def mesh_grid(groups: Sequence[Sequence[int]], title: str = "rollout TP groups", label: str = "TP group") -> go.Figure:
    """Draw ranks as cells, one row per group (e.g. rollout TP groups [[0,1],[2,3],[4,5]])."""
    fig = Figure()
    for g, ranks in enumerate(groups):
        fig.add_trace(
            go.Scatter(
                x=list(range(len(ranks))),
                y=[g] * len(ranks),
                mode="markers+text",
                marker=dict(size=44, symbol="square", color=PALETTE[g % len(PALETTE)]),
                text=[f"GPU {r}" for r in ranks],
                textfont=dict(color="white"),
                name=f"{label} {g}",
            )
        )
    fig.update_yaxes(
        autorange="reversed", tickvals=list(range(len(groups))), ticktext=[f"{label} {g}" for g in range(len(groups))]
    )
    fig.update_xaxes(tickvals=list(range(max((len(g) for g in groups), default=0))))
    return _layout(fig, title, "rank within the group", "group")
