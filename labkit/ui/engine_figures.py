"""Figures and tables of notebook 11 (the rollout engine): the engine's plan on this machine, the gap between the
engine's and the actor's log-probs per response token, and how the batch shape alone moves the actor's log-probs."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
import torch

from labkit.plan.engine_plan import EnginePlan
from labkit.ui.figure_style import Figure
from labkit.ui.figures import PALETTE, _layout


def plan_table_html(plan: EnginePlan) -> str:
    """``labkit plan``'s engine table as HTML: each rollout key, its value and what it became here."""
    rows = "".join(f"<tr><td><b>{k}</b></td><td>{v}</td><td>{b}</td></tr>" for k, v, b in plan.rows())
    return f"<table><tr><th>rollout key</th><th>value</th><th>became</th></tr>{rows}</table>"


def gap_per_token(gaps: Mapping[str, Mapping[str, torch.Tensor]]) -> go.Figure:
    """|rollout − actor| log-prob of every response token against its position, one series per engine dtype
    (``gaps[label]`` from ``labkit.rl.rollout_metrics.token_gap``); a log axis, zeros drawn at 1e-9."""
    fig = Figure()
    for k, (label, g) in enumerate(gaps.items()):
        fig.add_trace(
            go.Scatter(
                x=g["position"].tolist(),
                y=g["diff"].abs().clamp(min=1e-9).tolist(),
                mode="markers",
                name=label,
                marker={"color": PALETTE[k % len(PALETTE)], "size": 5, "opacity": 0.6},
            )
        )
    fig = _layout(
        fig,
        "engine log-prob vs the actor's old_log_prob, per sampled token",
        "position in the response (tokens)",
        "|rollout − actor| log-prob (nats)",
    )
    fig.update_yaxes(type="log")
    return fig


def micro_batch_gap(gaps: Mapping[str, Mapping[int, torch.Tensor]]) -> go.Figure:
    """Box per (dtype, micro-batch size) of |log-prob − its micro-batch-1 value| (``rollout_metrics.micro_batch_gap``):
    the same tokens, the same weights, only the batch shape differs."""
    fig = Figure()
    for k, (label, per_micro) in enumerate(gaps.items()):
        for micro, d in per_micro.items():
            fig.add_trace(
                go.Box(
                    y=d.abs().clamp(min=1e-9).tolist(),
                    name=f"{label}, micro {micro}",
                    marker_color=PALETTE[k % len(PALETTE)],
                    boxpoints=False,
                )
            )
    fig = _layout(
        fig,
        "the actor's log-probs of the same tokens, scored in micro-batches of different sizes",
        "dtype and micro-batch size (rows)",
        "|Δ log-prob| vs micro-batch 1 (nats)",
    )
    fig.update_yaxes(type="log")
    return fig
