"""Plotly figures for micro-batch buckets and DP-rank balance (notebooks 03 and 04); complements ``labkit.ui.figures``.

Inputs are plain lists (tokens per bucket, counts per rank, rows in a rank's order) so the same figure serves the
seed's worked example, a planner trace and a live run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from labkit.rules.geometry import workload
from labkit.ui.figure_style import PALETTE, Figure, hline, hline_spec, plain_figure, set_layout

TOKENS = "real tokens"


def _layout(fig: go.Figure, title: str, x: str, y: str, height: int = 360) -> go.Figure:
    return set_layout(fig, title, x, y, height)


def _ratio(values: Sequence[float]) -> str:
    return f"{max(values) / min(values):.2f}" if values and min(values) > 0 else "n/a"


def _budget_line(fig: go.Figure, budget: int | None) -> None:
    if budget is not None:
        hline(fig, budget, f"budget {budget} tokens")


def bucket_bars(
    groups: Mapping[str, Sequence[int]], budget: int | None = None, title: str = "micro-batches of one rank"
) -> go.Figure:
    """Tokens per micro-batch for several strategies side by side (x = micro-batch in execution order)."""
    fig = Figure()
    for i, (name, tokens) in enumerate(groups.items()):
        fig.add_trace(
            go.Bar(
                x=[f"micro {j}" for j in range(len(tokens))],
                y=list(tokens),
                text=list(tokens),
                textposition="auto",
                name=f"{name} (max/min {_ratio(tokens)})",
                marker_color=PALETTE[i % len(PALETTE)],
            )
        )
    fig.update_layout(barmode="group")
    _budget_line(fig, budget)
    return _layout(fig, title, "micro-batch (execution order)", TOKENS)


def counts_per_rank(counts: Mapping[str, Sequence[int]], title: str = "micro-batches per DP rank") -> go.Figure:
    """Micro-batch count per DP rank for several cases (e.g. each rank alone vs after the DP MAX all-reduce)."""
    bars = [
        {
            "type": "bar",
            "x": [f"dp {r}" for r in range(len(values))],
            "y": list(values),
            "text": [str(v) for v in values],
            "textposition": "auto",
            "name": name,
            "marker": {"color": PALETTE[(i + 3) % len(PALETTE)]},
        }
        for i, (name, values) in enumerate(counts.items())
    ]
    return plain_figure(bars, title, "DP rank", "micro-batches (forward passes)", barmode="group")


def stacked_micro(
    per_rank_tokens: Sequence[Sequence[int]], budget: int | None = None, title: str = "micro-batches per DP rank"
) -> go.Figure:
    """One stacked bar per DP rank, one segment per micro-batch, from plain token lists (budget as a dashed line)."""
    depth = max((len(t) for t in per_rank_tokens), default=0)
    xs = [f"dp {r}" for r in range(len(per_rank_tokens))]
    bars = []
    for i in range(depth):
        ys = [t[i] if i < len(t) else 0 for t in per_rank_tokens]
        hover = [f"micro {i}: {y} tokens" + (" > budget" if budget and y > budget else "") for y in ys]
        bars.append(
            {"type": "bar", "x": xs, "y": ys, "name": f"micro {i}", "marker": {"color": PALETTE[i % len(PALETTE)]}}
            | {"hovertext": hover}
        )
    note = f"each segment should stay below {budget} tokens"
    notes = [dict(text=note, xref="paper", yref="paper", x=1, y=1.08, showarrow=False)] if budget is not None else []
    return plain_figure(bars, title, "DP rank", TOKENS, barmode="stack", annotations=notes)


def micro_vs_budget(
    per_rank_tokens: Sequence[Sequence[int]], budget: int, title: str = "every micro-batch against the budget"
) -> go.Figure:
    """Each micro-batch as a point (x = DP rank, y = tokens), red above the budget line: is the budget a cap?"""
    xs, ys, colors = [], [], []
    for r, toks in enumerate(per_rank_tokens):
        for t in toks:
            xs.append(f"dp {r}")
            ys.append(t)
            colors.append(PALETTE[3] if t > budget else PALETTE[0])
    points = {
        "type": "scatter",
        "x": xs,
        "y": ys,
        "mode": "markers",
        "marker": {"size": 11, "color": colors},
        "name": "micro-batch",
        "hovertext": [f"{y} tokens" for y in ys],
    }
    over = sum(y > budget for y in ys)
    line = hline_spec(budget, f"budget {budget} tokens")
    return plain_figure([points], f"{title}: {over} of {len(ys)} above the budget", "DP rank", TOKENS, **line)


def sp_split(
    micro_tokens: Sequence[int],
    per_sp_rank: Sequence[int],
    budget: int,
    sp: int,
    title: str = "one DP group: micro-batch vs what each SP rank holds",
) -> go.Figure:
    """A DP group's micro-batches (packed to ≤ budget·sp) next to the slice each SP rank holds after the split."""
    fig = Figure()
    xs = [f"micro {i}" for i in range(len(micro_tokens))]
    fig.add_trace(
        go.Bar(
            x=xs,
            y=list(micro_tokens),
            name=f"micro-batch of the DP group (budget×sp = {budget * sp})",
            marker_color=PALETTE[1],
        )
    )
    fig.add_trace(go.Bar(x=xs, y=list(per_sp_rank), name=f"on each of the {sp} SP ranks", marker_color=PALETTE[2]))
    fig.update_layout(barmode="group")
    _budget_line(fig, budget)
    return _layout(fig, title, "micro-batch", TOKENS)


def rank_rows(lengths: Sequence[int], title: str = "rows of one DP rank, in the order it receives them") -> go.Figure:
    """Row lengths of one rank in dispatch order (``_balance_batch`` puts them small … large … small)."""
    bar = {
        "type": "bar",
        "x": list(range(len(lengths))),
        "y": list(lengths),
        "marker": {"color": PALETTE[4]},
        "hovertext": [f"row {i}: {x} tokens, workload {workload(x):,}" for i, x in enumerate(lengths)],
    }
    return plain_figure([bar], title, "row position on the rank", TOKENS)


def metrics_bars(metrics: Mapping[str, float], title: str = "what verl logs after _balance_batch") -> go.Figure:
    """The ``global_seqlen/*`` metrics under their exact names (token sums; minmax_diff is the pre-balance spread)."""
    names = list(metrics)
    colors = [PALETTE[2] if "balanced" in k else PALETTE[0] if k.endswith("mean") else PALETTE[3] for k in names]
    bar = {
        "type": "bar",
        "x": names,
        "y": [metrics[k] for k in names],
        "marker": {"color": colors},
        "text": [f"{metrics[k]:,.0f}" for k in names],
        "textposition": "auto",
    }
    return plain_figure([bar], title, "metric name (as logged)", "tokens per DP rank")


def rank_totals(
    groups: Mapping[str, Sequence[int]], title: str = "tokens per DP rank", what: str = TOKENS
) -> go.Figure:
    """Per-DP-rank totals for several cases side by side, with max/min in the legend."""
    fig = Figure()
    for i, (name, values) in enumerate(groups.items()):
        fig.add_trace(
            go.Bar(
                x=[f"dp {r}" for r in range(len(values))],
                y=list(values),
                text=list(values),
                textposition="auto",
                name=f"{name} (max/min {_ratio(values)})",
                marker_color=PALETTE[(i + 5) % len(PALETTE)],
            )
        )
    fig.update_layout(barmode="group")
    return _layout(fig, title, "DP rank", what)
