"""Notebook 06's pieces: the config of a live GRPO step from a few knobs, its figures (per-rank token balance of every
stage, prediction vs observation, peak memory, reward curve) and an ipywidgets panel that runs a step on request.

A widget never starts processes until its button is pressed (live runs only when the user asks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from labkit.config.verl_config import VerlConfig
from labkit.trace import StepTrace
from labkit.trainer.grpo_trainer import trainer_config
from labkit.ui import figures, lessons
from labkit.ui.figure_style import Figure
from labkit.ui.html_table import html_table

RANK_STAGES = ("generate", "balance", "old_log_prob", "ref_log_prob", "update_actor")


def step_config(
    *,
    ranks: int = 4,
    n_prompts: int = 8,
    n: int = 4,
    tp: int = 1,
    sp: int = 1,
    dynamic: bool = False,
    budget: int = 64,
    micro: int = 4,
    use_kl_loss: bool = False,
    prompt_length: int = 24,
    response_length: int = 32,
    profile: str = "engine",
) -> VerlConfig:
    """The trainer's config for the notebook knobs (n, TP, SP, dynamic bsz, token budget), via lessons.overrides."""
    over = lessons.overrides(
        ranks=ranks,
        n_prompts=n_prompts,
        n=n,
        prompt_length=prompt_length,
        response_length=response_length,
        dynamic=dynamic,
        budget=budget,
        micro=micro,
        sp=sp,
        tp=tp,
    )
    over.append(f"actor_rollout_ref.actor.use_kl_loss={str(use_kl_loss).lower()}")
    return trainer_config(over, profile=profile)


def token_balance(trace: StepTrace, stages: Sequence[str] = RANK_STAGES) -> go.Figure:
    """Tokens per rank at every rank stage of one step (grouped bars; x = global rank). ``generate`` counts the prompt
    tokens a rollout rank receives; the later stages count prompt + response tokens (attention_mask sum)."""
    fig = Figure()
    for stage in stages:
        recs = trace.at(stage)
        if recs:
            fig.add_trace(go.Bar(x=[f"rank {r.rank}" for r in recs], y=[r.tokens for r in recs], name=stage))
    fig.update_layout(
        barmode="group",
        title=f"tokens per rank, every stage ({trace.source})",
        xaxis_title="global rank",
        yaxis_title="tokens (generate: prompt; later stages: prompt + response)",
    )
    return fig


def peak_memory(trace: StepTrace) -> go.Figure:
    """Peak resident memory (MiB, ru_maxrss) per rank after each rank stage of the live step."""
    fig = Figure()
    for stage in RANK_STAGES:
        recs = [r for r in trace.at(stage) if r.bytes_measured]
        if recs:
            fig.add_trace(
                go.Bar(x=[f"rank {r.rank}" for r in recs], y=[r.bytes_measured / 2**20 for r in recs], name=stage)
            )
    fig.update_layout(
        barmode="group",
        title="peak resident memory per rank (measured, CPU ranks)",
        xaxis_title="global rank",
        yaxis_title="peak RSS (MiB)",
    )
    return fig


def reward_curve(history: Sequence[dict], title: str = "mean rule reward per GRPO step") -> go.Figure:
    """critic/score/mean per GRPO step."""
    steps = [int(h["training/global_step"]) for h in history]
    fig = Figure(
        go.Scatter(x=steps, y=[h["critic/score/mean"] for h in history], mode="lines+markers", name="critic/score/mean")
    )
    fig.update_layout(title=title, xaxis_title="GRPO step", yaxis_title="critic/score/mean (fraction correct, 0–1)")
    return fig


def timing_table_html(metrics: dict[str, Any]) -> str:
    """verl's timing_s/* of one step as an HTML table."""
    rows = [(k, round(float(v), 3)) for k, v in metrics.items() if k.startswith("timing_s/")]
    return html_table(rows, ["metric", "seconds"])


def _tp_sizes(candidates: Sequence[int]) -> list[int]:
    """The rollout TP sizes the shipped model splits into (whole attention and KV heads, MLP columns)."""
    from types import SimpleNamespace

    from labkit.model.tp_parallel import check_tp_split
    from labkit.trainer.engine_setup import model_values

    config, sizes = SimpleNamespace(**model_values()), []
    for tp in candidates:
        try:
            check_tp_split(config, tp)
        except ValueError:
            continue
        sizes.append(tp)
    return sizes


def live_step_panel(launcher: str = "auto", lr: float = 1e-3) -> Any:
    """Knobs for n, TP, SP, dynamic bsz and budget; the button starts a group, runs one step, shows the figures and
    prediction-vs-observation, and closes the group. A status line names the stage running (start-up included, the
    seconds the ranks take to start) and ends with the time taken or the error."""
    import ipywidgets as W
    from IPython.display import display

    from labkit.trainer.grpo_trainer import GRPOTrainer
    from labkit.ui.live_status import LiveStatus

    knobs = {
        "n": W.IntText(value=4, description="rollout.n", layout=W.Layout(width="180px")),
        "tp": W.Dropdown(options=_tp_sizes((1, 2, 4)), value=1, description="rollout TP"),
        "sp": W.Dropdown(options=[1, 2, 4], value=1, description="Ulysses SP"),
        "dynamic": W.Checkbox(value=False, description="use_dynamic_bsz"),
        "budget": W.IntText(value=64, description="token budget", layout=W.Layout(width="200px")),
    }
    button, out, status = W.Button(description="run one live GRPO step"), W.Output(), LiveStatus()

    def run(_: Any) -> None:
        out.clear_output()
        with out, status.run("reading the config", button):
            cfg = step_config(**{k: w.value for k, w in knobs.items()})
            with GRPOTrainer(cfg, launcher=launcher, lr=lr, on_stage=status.stage) as tr:
                metrics = tr.step()
                pred = tr.prediction()
                mismatches = tr.mismatches()
                status.stage("closing the group")
            display(W.HTML(timing_table_html(metrics)))
            token_balance(tr.trace).show()
            for stage in ("balance", "old_log_prob", "update_actor"):
                figures.compare_bars(pred, tr.trace, stage, "tokens").show()
            status.done("prediction == observation" if not mismatches else f"{len(mismatches)} mismatches")

    button.on_click(run)
    return W.VBox([W.HBox(list(knobs.values())[:3]), W.HBox(list(knobs.values())[3:] + [button]), status.widget, out])
