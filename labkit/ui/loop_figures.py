"""Figures of notebook 10: one config under the legacy, engine-v0 and engine-v1 loops (``labkit.plan.loops``)."""

from __future__ import annotations

import plotly.graph_objects as go

from labkit.trace import StepTrace
from labkit.ui.figure_style import Figure
from labkit.ui.figures import PALETTE, _layout


def rank_order(traces: dict[str, StepTrace], lengths: dict[str, list[int]], dp_rank: int = 0) -> go.Figure:
    """Tokens of each row of one DP rank in the order the rank holds them, per loop: v0 sorts small…large…small,
    v1 keeps completion order with its padding rows (128 tokens) last. ``lengths[loop]``: the plan's row lengths."""
    fig = Figure()
    for k, (loop, tr) in enumerate(traces.items()):
        rec = next((r for r in tr.at("balance") if r.dp_rank == dp_rank), None)
        if rec is None:
            continue
        idx = rec.extra["indices"]
        fig.add_trace(
            go.Scatter(
                x=list(range(len(idx))),
                y=[lengths[loop][i] for i in idx],
                mode="lines+markers",
                name=loop,
                marker_color=PALETTE[k % len(PALETTE)],
            )
        )
    return _layout(fig, f"rows of DP rank {dp_rank} in the order the rank holds them", "position in the rank", "tokens")


def rows_per_rank(traces: dict[str, StepTrace], stage: str = "old_log_prob") -> go.Figure:
    """Rows and real tokens per DP rank at ``stage``, one bar group per loop (v1 includes its padding rows)."""
    fig = Figure()
    for k, (loop, tr) in enumerate(traces.items()):
        recs = {r.dp_rank: r for r in tr.at(stage)}
        fig.add_trace(
            go.Bar(
                x=[f"dp {d}" for d in sorted(recs)],
                y=[recs[d].rows for d in sorted(recs)],
                name=loop,
                marker_color=PALETTE[k % len(PALETTE)],
            )
        )
    return _layout(fig, f"rows per DP rank at {stage}", "DP rank", "rows")
