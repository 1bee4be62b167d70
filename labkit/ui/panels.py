"""Notebook 01's panel: type any config size, the plan and verl's verdict recompute at once (arithmetic only);
and notebook 05's slider over the tokens each Ulysses SP rank holds.

Every change re-reads the config, runs ``labkit.validate.report.check`` (with its verified fixes) and
``labkit.plan.step.plan``, and redraws the verdict card, the stage table and the figures; a config verl rejects clears the
figures, so its card stands where they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ipywidgets as W

from labkit.config.messages import ConfigError
from labkit.config.verl_config import load_config
from labkit.trace import StepTrace
from labkit.ui import panel_parts as parts
from labkit.ui import widget_outputs as outputs
from labkit.ui.figure_style import specs
from labkit.ui.plan_tables import stage_table_html
from labkit.ui.verdict import verdict_html

__all__ = ["FOUR_LAYER_KEYS", "plan_panel", "sp_slices_panel", "stage_table_html", "verdict_html"]

ARR = "actor_rollout_ref"
# (override key, label): every size of the four layers, with the world (nodes x GPUs) and the token budget
FOUR_LAYER_KEYS = [
    ("data.train_batch_size", "B (prompts)"),
    (f"{ARR}.rollout.n", "rollout.n"),
    ("trainer.n_gpus_per_node", "GPUs per node"),
    ("trainer.nnodes", "nodes"),
    (f"{ARR}.rollout.tensor_model_parallel_size", "rollout TP"),
    (f"{ARR}.actor.ulysses_sequence_parallel_size", "Ulysses SP"),
    (f"{ARR}.actor.ppo_mini_batch_size", "mini (prompts)"),
    (f"{ARR}.actor.ppo_micro_batch_size_per_gpu", "micro / GPU (rows)"),
    (f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu", "log-prob micro / GPU"),
    (f"{ARR}.actor.ppo_max_token_len_per_gpu", "token budget / GPU"),
    ("data.max_prompt_length", "prompt length"),
    ("data.max_response_length", "response length"),
]
DYNAMIC = f"{ARR}.actor.use_dynamic_bsz"  # the log-prob passes follow it unless set on their own


def plan_panel(
    base_overrides: Sequence[str],
    keys: Sequence[tuple[str, str]] = FOUR_LAYER_KEYS,
    profile: str = "legacy",
    figures: Callable[[StepTrace], list] | None = None,
    loop: str = "v1",
    lengths: str = "full-width",
) -> W.VBox:
    """Number boxes over config keys, dynamic batch size, profile, trainer loop, the rows' lengths and free
    overrides; every change re-runs ``check`` and ``plan`` and redraws the verdict, the stage table and
    ``figures(trace)``. The lengths (a profile of data/length_profiles.json, seed 0; "full-width": every row at
    prompt + response length) are what a token budget cuts: without them dynamic micro-batches have no count."""
    from labkit.config.lengths import LengthsError
    from labkit.plan.step import plan
    from labkit.validate.report import check

    base = load_config(overrides=base_overrides, profile=profile)
    boxes = {key: parts.int_box(label, base.get(key) or 1, key) for key, label in keys}
    dynamic = W.Checkbox(value=bool(base.get(DYNAMIC)), description="use_dynamic_bsz (token budget)", indent=False)
    prof = parts.profile_toggle(profile)
    loops = parts.loop_toggle(loop, profile)
    extra = parts.extra_box()
    rows = parts.lengths_dropdown(lengths, parts.row_width(base), "row lengths")
    verdict, table, area = W.HTML(), W.HTML(), parts.FigureArea()

    def redraw(_: object = None) -> None:
        if parts.refitting(rows):
            return
        loops.disabled = prof.value == "legacy"
        overrides = [
            *base_overrides,
            *(f"{k}={box.value}" for k, box in boxes.items()),
            f"{DYNAMIC}={str(dynamic.value).lower()}",
            *parts.loop_overrides(prof.value, loops.value),
            *extra.value.split(),
        ]
        try:
            cfg = load_config(overrides=overrides, profile=prof.value)
            parts.refit_lengths(rows, parts.row_width(cfg))  # the profiles these rows can hold
            report = check(cfg)
            trace = plan(cfg, rows.value)
        except (ConfigError, LengthsError) as exc:  # PlanTooLarge included: the card says why, with the arithmetic
            verdict.value, table.value = verdict_html(exc), ""
            area.clear()
            return
        verdict.value = verdict_html(report)
        table.value = stage_table_html(trace, report)
        if not report.ok:
            area.clear()  # the card above replaces the figures: no figure of an earlier setting stays
        elif figures is not None:
            with specs():
                area.figures(figures(trace))

    for w in [*boxes.values(), dynamic, prof, loops, rows, extra]:
        w.observe(redraw, names="value")
    redraw()
    half = (len(boxes) + 1) // 2
    values = list(boxes.values())
    controls = W.VBox(
        [
            W.HBox([prof, loops]),
            W.HBox([parts.column(values[:half]), parts.column(values[half:] + [dynamic, rows])]),
            extra,
        ]
    )
    panel = W.VBox([controls, verdict, table, area.out])
    panel.figure_area = area  # tests read what the last draw showed
    return panel


def sp_slices_panel(n_tokens: int = 7, sp: int = 2) -> W.VBox:
    """A packed row of ``n_tokens`` (nnz) and an SP size: the token positions each Ulysses SP rank holds after
    ``ulysses_pad`` (``labkit.model.ulysses_demo.sp_slices``)."""
    from labkit.model.ulysses_demo import sp_slices

    nnz = W.IntSlider(value=n_tokens, min=1, max=40, description="nnz")
    size = W.Dropdown(options=[1, 2, 4, 8], value=sp, description="sp")
    out = W.Output()

    def redraw(_: object = None) -> None:
        held = {f"rank {r}": s for r, s in enumerate(sp_slices(nnz.value, size.value))}
        outputs.show(out, outputs.text_output(str(held)))

    for w in (nnz, size):
        w.observe(redraw, names="value")
    redraw()
    return W.VBox([W.HBox([nnz, size]), out])
