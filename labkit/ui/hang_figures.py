"""Plotly figures of a hang: every rank's collectives on one time axis (which rank waited in which collective, and for
how long), and the collectives each rank issued side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from labkit.ui.figure_style import Figure
from labkit.ui.figures import PALETTE, _layout

OUTCOME_COLOR = {"timeout": "#E45756", "raised": "#000000", "stopped": "#F58518", "waiting": "#E45756"}


def collective_timeline(events: Sequence[dict[str, Any]], title: str = "collectives per rank") -> go.Figure:
    """One horizontal bar per logged event (``labkit.hangs.diagnosis.timeline``), rank on the y axis, seconds from
    the first event on the x axis; collectives that completed are coloured by name, a wait that ended in the
    timeout is red, a rank that raised is a black mark, a loop the lab stopped is orange."""
    fig = Figure()
    names = sorted({e["collective"] for e in events if e["outcome"] == "ok" and e.get("group") is not None})
    color = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    shown: set[str] = set()
    for e in events:
        if e["outcome"] == "ok" and e.get("group") is None:  # a rank's return: a thin grey tick
            key, col = "returned", "#9D9D9D"
        elif e["outcome"] == "ok":
            key, col = e["collective"], color[e["collective"]]
        else:
            key, col = f"{e['collective']} ({e['outcome']})", OUTCOME_COLOR.get(e["outcome"], "#E45756")
        width = max(e["end_s"] - e["start_s"], 0.02)
        label = f"{e['collective']}" + (f" #{e['call']}" if e.get("call") else "")
        micro = e.get("micro_batch")
        fig.add_trace(
            go.Bar(
                x=[width],
                y=[f"rank {e['rank']}"],
                base=[e["start_s"]],
                orientation="h",
                marker_color=col,
                name=key,
                legendgroup=key,
                showlegend=key not in shown,
                hovertext=f"{label}; stage {e.get('stage')}, micro-batch {micro}; {e['outcome']}; {width:.3f} s",
                hoverinfo="text",
            )
        )
        shown.add(key)
    fig.update_layout(barmode="overlay")
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, title, "time since the first collective (s)", "rank")


def issued_counts(diagnosis: Any, title: str = "collectives issued per rank") -> go.Figure:
    """Grouped bars: how many of each collective every rank entered (completed + the one it waited in)."""
    names = sorted({k for r in diagnosis.ranks for k in r.issued})
    fig = Figure()
    for i, r in enumerate(diagnosis.ranks):
        fig.add_trace(
            go.Bar(
                x=names,
                y=[r.issued.get(n, 0) for n in names],
                name=f"rank {r.rank} ({r.outcome})",
                marker_color=PALETTE[i % len(PALETTE)],
            )
        )
    fig.update_layout(barmode="group")
    return _layout(fig, title, "collective", "calls entered")


def risk_by_budget(budgets: Sequence[int], probabilities: Sequence[float], title: str) -> go.Figure:
    """Probability of hang (a) over drawn lengths against the token budget per GPU."""
    fig = Figure(go.Scatter(x=list(budgets), y=list(probabilities), mode="lines+markers", marker_color=PALETTE[3]))
    fig.update_yaxes(range=[0, 1])
    return _layout(fig, title, "log_prob_max_token_len_per_gpu (tokens)", "share of drawn batches that hang")
