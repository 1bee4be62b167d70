"""ipywidgets panels for notebooks 03 (micro-batches) and 04 (``_balance_batch``): pure arithmetic, no processes.

Every change re-runs ``labkit.plan.step.plan`` (and ``labkit.validate.report.check`` for verl's verdict) and redraws the figures.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from labkit.config.lengths import LengthsError, profile_names
from labkit.config.verl_config import ConfigError, load_config
from labkit.plan.step import plan
from labkit.rules.geometry import lengths_for_config
from labkit.ui import balance_figures, figures, lessons
from labkit.ui.verdict import verdict_html
from labkit.validate.report import check

_STYLE = {"description_width": "150px"}


def _slider(label: str, value: int, lo: int, hi: int, step: int = 1) -> W.IntSlider:
    return W.IntSlider(
        value=value,
        min=lo,
        max=hi,
        step=step,
        description=label,
        continuous_update=False,
        style=_STYLE,
        layout=W.Layout(width="440px"),
    )


def _panel(controls: dict[str, W.Widget], redraw: Callable[[dict[str, Any]], tuple[str, list]]) -> W.VBox:
    """Controls on the left, verl's verdict on the right, figures below; ``redraw(values) -> (html, figs)``."""
    verdict, plots = W.HTML(), W.Output()

    def on_change(_: Any = None) -> None:
        values = {k: c.value for k, c in controls.items()}
        try:
            text, figs = redraw(values)
        except (ConfigError, LengthsError, ValueError, AssertionError) as exc:
            text, figs = f"<pre>{html.escape(type(exc).__name__ + ': ' + str(exc))}</pre>", []
        verdict.value = text
        with plots:
            plots.clear_output(wait=True)
            for fig in figs:
                fig.show()

    for c in controls.values():
        c.observe(on_change, names="value")
    on_change()
    return W.VBox([W.HBox([W.VBox(list(controls.values())), verdict]), plots])


def micro_batch_panel(
    *,
    ranks: int = 4,
    sp: int = 1,
    n_prompts: int = 16,
    n: int = 4,
    lengths: str = "long-reasoning",
    prompt_length: int = 1024,
    response_length: int = 4096,
    budget: int = 8192,
    micro: int = 4,
    profile: str = "legacy",
    seed: int = 0,
) -> W.VBox:
    """Budget, micro size, ranks, SP, length profile and verl profile → static vs dynamic micro-batches of
    ``old_log_prob`` per rank, every dynamic micro-batch against the budget, and the counts with / without the
    DP MAX all-reduce."""
    controls = {
        "budget": _slider("token budget / GPU", budget, 1024, 65536, 512),
        "micro": _slider("micro rows / GPU", micro, 1, 64),
        "ranks": _slider("GPUs (ranks)", ranks, 1, 16),
        "sp": W.Dropdown(options=[1, 2, 4, 8], value=sp, description="Ulysses SP", style=_STYLE),
        "lengths": W.Dropdown(options=profile_names(), value=lengths, description="length profile", style=_STYLE),
        "profile": W.ToggleButtons(options=["legacy", "engine"], value=profile, description="verl profile"),
    }

    def redraw(v: dict[str, Any]) -> tuple[str, list]:
        common = dict(
            ranks=v["ranks"],
            sp=v["sp"],
            n_prompts=n_prompts,
            n=n,
            prompt_length=prompt_length,
            response_length=response_length,
            budget=v["budget"],
            micro=v["micro"],
        )
        static_cfg = load_config(overrides=lessons.overrides(dynamic=False, **common), profile=v["profile"])
        dyn_cfg = load_config(overrides=lessons.overrides(dynamic=True, **common), profile=v["profile"])
        lens = lengths_for_config(dyn_cfg, v["lengths"], seed)
        static, dyn = plan(static_cfg, lens), plan(dyn_cfg, lens)
        figs = []
        if static.at("old_log_prob"):
            figs.append(figures.micro_batch_stack(static, "old_log_prob", "tokens"))
        total = v["budget"] * v["sp"]
        head = (
            f"<b>dynamic budget</b> = {v['budget']} × sp {v['sp']} = <b>{total}</b> tokens per DP group "
            f"micro-batch ({v['profile']})<br>"
        )
        if dyn.at("old_log_prob"):
            toks = lessons.trace_micro_tokens(dyn, "old_log_prob")
            figs.append(balance_figures.stacked_micro(toks, total, "dynamic micro-batches per DP rank"))
            figs.append(balance_figures.micro_vs_budget(toks, total))
            per_rank = lessons.dp_lengths(lens, v["ranks"] // v["sp"], balance=True)
            figs.append(
                balance_figures.counts_per_rank(
                    {
                        "each rank alone (no dp_group)": lessons.micro_counts(
                            per_rank, total, v["profile"], sync=False
                        ),
                        "after all_reduce(MAX)": lessons.micro_counts(per_rank, total, v["profile"], sync=True),
                    }
                )
            )
        return head + verdict_html(check(dyn_cfg, max_seq_len=max(lens), fixes=False)), figs

    return _panel(controls, redraw)


def balance_panel(
    *,
    ranks: int = 4,
    sp: int = 1,
    n_prompts: int = 16,
    n: int = 4,
    lengths: str = "long-reasoning",
    prompt_length: int = 1024,
    response_length: int = 4096,
    seed: int = 0,
) -> W.VBox:
    """Ranks, SP, batch and length profile → tokens per DP rank before / after ``_balance_batch``, the
    ``global_seqlen/*`` metrics and the row order inside DP rank 0."""
    controls = {
        "ranks": _slider("GPUs (ranks)", ranks, 1, 16),
        "sp": W.Dropdown(options=[1, 2, 4, 8], value=sp, description="Ulysses SP", style=_STYLE),
        "n_prompts": _slider("B (prompts)", n_prompts, 1, 128),
        "n": _slider("rollout.n", n, 1, 16),
        "lengths": W.Dropdown(options=profile_names(), value=lengths, description="length profile", style=_STYLE),
        "seed": _slider("seed", seed, 0, 20),
    }

    def redraw(v: dict[str, Any]) -> tuple[str, list]:
        cfg = load_config(
            overrides=lessons.overrides(
                ranks=v["ranks"],
                sp=v["sp"],
                n_prompts=v["n_prompts"],
                n=v["n"],
                prompt_length=prompt_length,
                response_length=response_length,
                dynamic=True,
                budget=prompt_length + response_length,
                micro=1,
            )
            + ["trainer.use_v1=false"]  # RayPPOTrainer._balance_batch (v0); notebook 10 shows v1's
        )
        trace = plan(cfg, v["lengths"], seed=v["seed"])
        metrics = trace.summary.get("global_seqlen")
        stage = trace.stage("balance")
        text = f"<b>{html.escape(stage.formula)}</b><br>{html.escape(stage.note)}"
        if not metrics:
            return text, []
        recs = lessons.dp_records(trace, "balance")
        rank0 = lessons.rank_lengths(trace, lengths_for_config(cfg, v["lengths"], v["seed"]))[0]
        return text, [
            figures.before_after([r.extra["tokens_before"] for r in recs], [r.tokens for r in recs], "real tokens"),
            balance_figures.metrics_bars(metrics),
            balance_figures.rank_rows(rank0),
        ]

    return _panel(controls, redraw)
