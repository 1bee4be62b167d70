"""Figures and a widget panel for the live rollout: rows per rank (received, generated on, returned), response
lengths per returning rank, generate time per rank, and prediction vs observation side by side."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from labkit.protocol.data_proto import DataProto
from labkit.trace import StepTrace
from labkit.trainer.live_config import rollout_config
from labkit.trainer.live_rollout import RETURNED, LiveRollout, returned
from labkit.ui.figure_style import Figure
from labkit.ui.figures import PALETTE, _layout


def _label(r) -> str:
    return f"rank {r.rank}<br>dp {r.dp_rank} · tp {r.tp_rank}"


def rows_per_rank(trace: StepTrace, stage: str = "generate") -> go.Figure:
    """Per rank: rows received from the driver, rows generated on (after any TP all-gather), rows returned."""
    recs = trace.at(stage)
    x = [_label(r) for r in recs]
    series = (
        ("received from the driver", [r.extra["recv_rows"] for r in recs]),
        ("generated on", [r.rows for r in recs]),
        ("returned to the driver", [r.extra["out_rows"] if r.extra["collected"] else 0 for r in recs]),
    )
    fig = Figure(
        [
            go.Bar(x=x, y=y, name=name, marker_color=PALETTE[i], text=y, textposition="auto")
            for i, (name, y) in enumerate(series)
        ]
    )
    fig.update_layout(barmode="group")
    return _layout(
        fig, f"{stage} [{trace.summary.get('dispatch', '')}]: rows per rank", "global rank", "rows (samples)"
    )


def response_lengths(out: DataProto, trace: StepTrace, stage: str = "generate") -> go.Figure:
    """Response lengths (tokens up to and including EOS) of the rows each returning rank produced, one box per rank."""
    lengths = out.batch["response_length"].tolist()
    fig, start = Figure(), 0
    for r in trace.at(stage):
        if not r.extra["collected"]:
            continue
        rows = lengths[start : start + r.extra["out_rows"]]
        start += r.extra["out_rows"]
        fig.add_trace(
            go.Box(
                y=rows,
                name=_label(r),
                boxpoints="all",
                jitter=0.4,
                marker_color=PALETTE[(r.dp_rank or 0) % len(PALETTE)],
            )
        )
    fig.update_layout(showlegend=False)
    return _layout(fig, "response lengths per returning rank", "global rank (returning)", "response length (tokens)")


def generate_time(trace: StepTrace, stage: str = "generate") -> go.Figure:
    """Wall time each rank spent in the call (generate, plus the all-gather in the ≤v0.5 variant)."""
    recs = trace.at(stage)
    y = [round(r.extra["elapsed_s"], 2) for r in recs]
    fig = Figure(go.Bar(x=[_label(r) for r in recs], y=y, text=y, textposition="auto", marker_color=PALETTE[3]))
    return _layout(fig, "time in the call per rank", "global rank", "time (s)")


def side_by_side(pred: StepTrace, obs: StepTrace, out: DataProto, stage: str = "generate") -> go.Figure:
    """A table, one line per rank: (dp, tp), rows and prompt tokens received, rows and tokens returned, predicted
    (plan) next to observed (live), and whether they agree."""
    full = out.batch["attention_mask"].sum(dim=1).tolist()
    p, o = pred.at(stage), obs.at(stage)
    pr, orr = returned(pred, full, stage).at(RETURNED), returned(obs, stage=stage).at(RETURNED)
    cols: dict[str, list] = {
        k: []
        for k in (
            "rank",
            "dp·tp plan",
            "dp·tp live",
            "rows plan",
            "rows live",
            "prompt tok plan",
            "prompt tok live",
            "returned plan",
            "returned live",
            "agree",
        )
    }
    for a, b, ra, rb in zip(p, o, pr, orr):
        same = (a.dp_rank, a.tp_rank, a.rows, a.tokens, ra.rows, ra.tokens) == (
            b.dp_rank,
            b.tp_rank,
            b.rows,
            b.tokens,
            rb.rows,
            rb.tokens,
        )
        for key, val in zip(
            cols,
            (
                a.rank,
                f"{a.dp_rank}·{a.tp_rank}",
                f"{b.dp_rank}·{b.tp_rank}",
                a.rows,
                b.rows,
                a.tokens,
                b.tokens,
                f"{ra.rows} ({ra.tokens} tok)",
                f"{rb.rows} ({rb.tokens} tok)",
                "✓" if same else "✗",
            ),
        ):
            cols[key].append(val)
    fig = Figure(
        go.Table(
            header=dict(values=list(cols), fill_color=PALETTE[0], font=dict(color="white")),
            cells=dict(values=list(cols.values())),
        )
    )
    fig.update_layout(
        title=f"{stage}: prediction (plan) vs observation (live), {obs.summary.get('dispatch', '')} dispatch",
        height=80 + 30 * len(p),
        margin=dict(l=10, r=10, t=40, b=10),
    )
    return fig


def rollout_panel(base_overrides: Sequence[str] = (), launcher: str = "auto"):
    """Widgets for n, rollout TP and the dispatch variant; the button starts a live group (W ranks), runs one
    rollout, closes the group and shows the figures next to the prediction. A status line says which stage runs and
    ends with the time taken or the error; the progress bar names the stages."""
    import ipywidgets as W
    from IPython.display import display

    from labkit.ui.live_status import LiveStatus

    n = W.IntText(value=4, description="rollout.n", layout=W.Layout(width="180px"))
    tp = W.Dropdown(options=[1, 2], value=1, description="rollout TP")
    disp = W.Dropdown(options=["mesh", "all_gather"], value="mesh", description="dispatch")
    button, out, status = W.Button(description="run live rollout", button_style="primary"), W.Output(), LiveStatus()

    def on_click(_):
        out.clear_output()
        with out, status.run("reading the config", button):
            cfg = rollout_config(
                [
                    *base_overrides,
                    f"actor_rollout_ref.rollout.n={n.value}",
                    f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp.value}",
                ]
            )
            with LiveRollout(cfg, launcher=launcher, on_stage=status.stage) as live:
                batch = live.batch(seed=0)
                pred = live.predict(batch, disp.value)
                result, trace = live.run(batch, dispatch=disp.value)
                status.stage("closing the group")
                left = live.close()["left_pids"]
            for fig in (side_by_side(pred, trace, result), rows_per_rank(trace), response_lengths(result, trace)):
                display(fig)
            status.done(
                f"group up {live.timings['group_up_s']:.1f} s, generate {trace.summary['generate_s']:.1f} s, "
                f"rank processes left: {left}"
            )

    button.on_click(on_click)
    return W.VBox([W.HBox([n, tp, disp, button]), status.widget, out])


def params_per_rank(info: Sequence[dict]) -> go.Figure:
    """Parameters each rank holds after TP sharding (from init_model's report), against the full model."""
    x = [f"rank {i['rank']}<br>TP group {i['tp_group']}" for i in info]
    y = [i["params_local"] for i in info]
    fig = Figure(go.Bar(x=x, y=y, text=y, textposition="auto", marker_color=PALETTE[4]))
    fig.add_hline(y=info[0]["params_full"], line_dash="dash", annotation_text=f"full model {info[0]['params_full']}")
    return _layout(
        fig,
        "parameters held per rank (embeddings and norms replicated, heads and MLP sharded)",
        "global rank",
        "parameters (count)",
    )
