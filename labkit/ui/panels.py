"""ipywidgets panels: move a slider, the plan and verl's verdict recompute at once (pure arithmetic, no processes)."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import ipywidgets as W

from labkit.config.verl_config import ConfigError, load_config
from labkit.trace import StepTrace
from labkit.ui.plan_tables import stage_table_html
from labkit.ui.verdict import verdict_html

__all__ = ["FOUR_LAYER_SLIDERS", "plan_panel", "stage_table_html", "verdict_html"]

# (override key, label, min, max, step)
FOUR_LAYER_SLIDERS = [
    ("data.train_batch_size", "B (prompts)", 1, 256, 1),
    ("actor_rollout_ref.rollout.n", "rollout.n", 1, 32, 1),
    ("trainer.n_gpus_per_node", "GPUs", 1, 16, 1),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "rollout TP", 1, 8, 1),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "Ulysses SP", 1, 8, 1),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "mini (prompts)", 1, 256, 1),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "micro/GPU", 1, 64, 1),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "log-prob micro/GPU", 1, 64, 1),
]


def plan_panel(
    base_overrides: Sequence[str],
    sliders: Sequence[tuple] = FOUR_LAYER_SLIDERS,
    profile: str = "legacy",
    figures: Callable[[StepTrace], list] | None = None,
) -> W.VBox:
    """Sliders over config keys; every change re-runs ``check`` and ``plan`` and redraws table, verdict, figures."""
    from labkit.plan.step import plan
    from labkit.validate.report import check

    base = load_config(overrides=base_overrides, profile=profile)
    controls = {}
    for key, label, lo, hi, step in sliders:
        controls[key] = W.IntSlider(
            value=int(base.get(key) or lo),
            min=lo,
            max=hi,
            step=step,
            description=label,
            continuous_update=False,
            style={"description_width": "140px"},
            layout=W.Layout(width="420px"),
        )
    prof = W.ToggleButtons(options=["legacy", "engine"], value=profile, description="profile")
    table, verdict, plots = W.HTML(), W.HTML(), W.Output()

    def redraw(_=None) -> None:
        overrides = list(base_overrides) + [f"{k}={c.value}" for k, c in controls.items()]
        try:
            cfg = load_config(overrides=overrides, profile=prof.value)
        except ConfigError as exc:
            verdict.value = f"<pre>{html.escape(str(exc))}</pre>"
            return
        report = check(cfg)
        trace = plan(cfg)
        verdict.value = verdict_html(report)
        table.value = stage_table_html(trace)
        if figures is not None:
            with plots:
                plots.clear_output(wait=True)
                for fig in figures(trace):
                    fig.show()

    for c in list(controls.values()) + [prof]:
        c.observe(redraw, names="value")
    redraw()
    return W.VBox([prof, W.HBox([W.VBox(list(controls.values())), verdict]), table, plots])
