"""Plotly figures over ``StepTrace``: the same functions draw a plan, a live trace, or both side by side."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from labkit.trace import StepTrace

UNITS = {
    "rows": "rows (samples)",
    "tokens": "real tokens",
    "padded_tokens": "tokens through the forward",
    "workload": "KK workload (24576·L + L²)",
    "n_micro": "micro-batches",
}
PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D"]
_GRID = dict(gridcolor="#EBF0F8", zerolinecolor="#EBF0F8", linecolor="#EBF0F8", automargin=True)
# the look of plotly_white in a few keys: the full template costs ~30 ms per figure to validate, a panel redraw has
# 100 ms for everything
LIGHT = go.layout.Template(
    layout=dict(plot_bgcolor="white", paper_bgcolor="white", colorway=PALETTE, xaxis=_GRID, yaxis=_GRID)
)


def _value(rec, metric: str):
    return rec.n_micro if metric == "n_micro" else getattr(rec, metric)


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        template=LIGHT,
        margin=dict(l=60, r=20, t=50, b=50),
        height=360,
        legend_title_text="",
    )
    return fig


def pipeline_funnel(trace: StepTrace) -> go.Figure:
    """Global rows at each stage, with the per-rank share as hover text."""
    stages = trace.stages
    fig = go.Figure(
        go.Bar(
            x=[s.name for s in stages],
            y=[s.global_rows for s in stages],
            text=[f"{s.global_rows} {s.unit}" for s in stages],
            textposition="outside",
            hovertext=[f"{s.title}<br>{s.formula}<br>per rank: {s.per_rank_rows}" for s in stages],
            marker_color=PALETTE[0],
        )
    )
    return _layout(fig, f"One training step ({trace.profile} profile, {trace.source})", "stage", "global rows")


def rank_bars(trace: StepTrace, stage: str, metric: str = "rows") -> go.Figure:
    """One bar per rank for one stage (rows, tokens, padded tokens, workload or micro-batch count)."""
    recs = trace.at(stage)
    fig = go.Figure(
        go.Bar(
            x=[f"rank {r.rank}" for r in recs],
            y=[_value(r, metric) for r in recs],
            marker_color=PALETTE[1],
            text=[_value(r, metric) for r in recs],
            textposition="auto",
        )
    )
    return _layout(fig, f"{stage}: {UNITS.get(metric, metric)} per rank", "global rank", UNITS.get(metric, metric))


def micro_batch_stack(trace: StepTrace, stage: str, metric: str = "tokens", budget: int | None = None) -> go.Figure:
    """Stacked micro-batches per rank (tokens or rows), with the token budget as a dashed line."""
    recs = trace.at(stage)
    fig = go.Figure()
    depth = max((r.n_micro for r in recs), default=0)
    for i in range(depth):
        ys = [getattr(r.micro_batches[i], metric) if i < r.n_micro else 0 for r in recs]
        fig.add_trace(
            go.Bar(x=[f"rank {r.rank}" for r in recs], y=ys, name=f"micro {i}", marker_color=PALETTE[i % len(PALETTE)])
        )
    fig.update_layout(barmode="stack")
    if budget is not None:
        fig.add_hline(y=budget, line_dash="dash", annotation_text=f"budget {budget} tokens")
    return _layout(fig, f"{stage}: micro-batches per rank", "global rank", UNITS.get(metric, metric))


def compare_bars(predicted: StepTrace, observed: StepTrace, stage: str, metric: str = "rows") -> go.Figure:
    """Prediction next to observation, per rank, for one stage."""
    fig = go.Figure()
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
    fig = go.Figure()
    for ys, name, color in ((before, "before", PALETTE[3]), (after, "after", PALETTE[2])):
        spread = max(ys) / max(min(ys), 1) if len(ys) else 0.0
        fig.add_trace(
            go.Bar(
                x=[f"dp {i}" for i in range(len(ys))],
                y=list(ys),
                name=f"{name} (max/min {spread:.3f})",
                marker_color=color,
            )
        )
    fig.update_layout(barmode="group")
    return _layout(fig, f"{what} per DP rank, before vs after", "DP rank", what)


def mesh_grid(groups: Sequence[Sequence[int]], title: str = "rollout TP groups", label: str = "TP group") -> go.Figure:
    """Draw ranks as cells, one row per group (e.g. rollout TP groups [[0,1],[2,3],[4,5]])."""
    fig = go.Figure()
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
