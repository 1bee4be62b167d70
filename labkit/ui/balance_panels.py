"""ipywidgets panels for notebooks 03 (micro-batches) and 04 (``_balance_batch``): pure arithmetic, no processes.

Every change runs verl's checks (``labkit.validate.report.check``, with the fixes it verifies, so every card of a code
with a fix shows it) and the functions the planner runs for these stages (``labkit.balance``), and redraws the
figures; a setting verl or labkit rejects clears them, and its verdict card stands in their place. The length-profile
dropdown offers only the profiles the panel's rows can hold (its width is fixed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as W

from labkit.balance import balance_batch, micro_batches
from labkit.config.lengths import LengthsError
from labkit.config.messages import ConfigError
from labkit.config.verl_config import load_config
from labkit.rules.geometry import lengths_for_config
from labkit.ui import balance_figures, figures, lessons
from labkit.ui import panel_parts as parts
from labkit.ui.figure_style import specs
from labkit.ui.verdict import verdict_html
from labkit.validate.report import check


def _panel(controls: dict[str, W.Widget], redraw: Callable[[dict[str, Any]], tuple[str, list]]) -> W.VBox:
    """Controls, then the verdict, then the figures; ``redraw(values) -> (html, figs)``, figs None when verl rejects
    the setting (the figures are cleared, never left from an earlier setting)."""
    verdict, area = W.HTML(), parts.FigureArea()

    def on_change(_: Any = None) -> None:
        values = {k: c.value for k, c in controls.items()}
        try:
            with specs():
                text, figs = redraw(values)
        except (ConfigError, LengthsError, ValueError, AssertionError) as exc:
            text, figs = verdict_html(exc), None
        verdict.value = text
        if figs is None:
            area.clear()
        else:
            area.figures(figs)

    for c in controls.values():
        c.observe(on_change, names="value")
    on_change()
    boxes = list(controls.values())
    half = (len(boxes) + 1) // 2
    panel = W.VBox([W.HBox([parts.column(boxes[:half]), parts.column(boxes[half:])]), verdict, area.out])
    panel.figure_area = area  # tests read what the last draw showed
    return panel


def _sp(value: int) -> W.IntText:
    return parts.int_box("Ulysses SP", value, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")


def _lengths(value: str, width: int) -> W.Dropdown:
    """The length profiles rows of ``width`` tokens can hold (the panel's width is fixed: no other is offered)."""
    return parts.lengths_dropdown(value, width)


class _Rows:
    """The drawn lengths and each DP rank's balanced rows, memoised per batch shape: a change of budget, micro size
    or profile re-cuts the same rows instead of drawing and balancing them again."""

    def __init__(self, seed: int) -> None:
        self.seed, self._lengths, self._ranks = seed, {}, {}

    def lengths(self, cfg: Any, profile_name: str, seed: int | None = None) -> list[int]:
        seed = self.seed if seed is None else seed
        g = (
            cfg.get("data.train_batch_size"),
            cfg.get("actor_rollout_ref.rollout.n"),
            cfg.get("data.max_prompt_length"),
        )
        key = (*g, cfg.get("data.max_response_length"), profile_name, seed)
        if key not in self._lengths:
            self._lengths[key] = [int(x) for x in lengths_for_config(cfg, profile_name, seed)]
        return self._lengths[key]

    def per_rank(self, lens: list[int], dp: int) -> list[list[int]]:
        key = (id(lens), dp)
        if key not in self._ranks:
            self._ranks[key] = lessons.dp_lengths(lens, dp, balance=True)
        return self._ranks[key]


def _static_tokens(per_rank: list[list[int]], micro: int) -> list[list[int]]:
    """Static micro-batches: consecutive slices of ``micro`` rows of each rank's rows (``DataProto.split``)."""
    return [[sum(rows[i : i + micro]) for i in range(0, len(rows), micro)] for rows in per_rank]


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
    """Budget, micro size, GPUs, SP, B, n, length profile and verl profile → static vs dynamic micro-batches of
    ``old_log_prob`` per DP rank after ``_balance_batch``, every dynamic micro-batch against the budget, and the
    counts with / without the DP MAX all-reduce (``labkit.balance.micro_batches``, as the planner runs them)."""
    controls = {
        "budget": parts.int_box("token budget / GPU", budget, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
        "micro": parts.int_box("micro rows / GPU", micro, "the *_micro_batch_size_per_gpu (static path)"),
        "ranks": parts.int_box("GPUs (ranks)", ranks, "trainer.n_gpus_per_node"),
        "sp": _sp(sp),
        "n_prompts": parts.int_box("B (prompts)", n_prompts, "data.train_batch_size (= ppo_mini_batch_size)"),
        "n": parts.int_box("rollout.n", n),
        "lengths": _lengths(lengths, prompt_length + response_length),
        "profile": parts.profile_toggle(profile),
    }
    rows = _Rows(seed)

    def redraw(v: dict[str, Any]) -> tuple[str, list | None]:
        common = dict(
            ranks=v["ranks"],
            sp=v["sp"],
            n_prompts=v["n_prompts"],
            n=v["n"],
            prompt_length=prompt_length,
            response_length=response_length,
            budget=v["budget"],
            micro=v["micro"],
        )
        static_cfg = load_config(overrides=lessons.overrides(dynamic=False, **common), profile=v["profile"])
        dyn_cfg = load_config(overrides=lessons.overrides(dynamic=True, **common), profile=v["profile"])
        lens = rows.lengths(dyn_cfg, v["lengths"])
        total = v["budget"] * v["sp"]
        head = (
            f"<b>dynamic budget</b> = {v['budget']} × sp {v['sp']} = <b>{total}</b> tokens per DP group "
            f"micro-batch ({v['profile']})<br>"
        )
        reports = {
            "static": check(static_cfg, max_seq_len=max(lens)),
            "dynamic": check(dyn_cfg, max_seq_len=max(lens)),
        }
        failed = {path: r for path, r in reports.items() if not r.ok}
        cards = "".join(f"<b>{path} path</b>{verdict_html(r)}" for path, r in failed.items())
        if "static" in failed:
            return head + cards, None
        per_rank = rows.per_rank(lens, v["ranks"] // v["sp"])
        static = balance_figures.stacked_micro(
            _static_tokens(per_rank, v["micro"]), None, f"static micro-batches of {v['micro']} rows per DP rank"
        )
        if failed:  # only the budget is rejected: the static split does not use it and stays
            return head + cards, [static]
        dyn = micro_batches.plan_dp_micro_batches(per_rank, total, profile=v["profile"])
        toks = [list(p.tokens) for p in dyn]
        alone = lessons.micro_counts(per_rank, total, v["profile"], sync=False)
        figs = [
            static,
            balance_figures.stacked_micro(toks, total, "dynamic micro-batches per DP rank"),
            balance_figures.micro_vs_budget(toks, total),
            balance_figures.counts_per_rank(
                {"each rank alone (no dp_group)": alone, "after all_reduce(MAX)": [p.num_micro_batches for p in dyn]}
            ),
        ]
        return head + verdict_html(reports["dynamic"]), figs

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
    """GPUs, SP, batch, length profile and seed → tokens per DP rank before / after ``_balance_batch``, the
    ``global_seqlen/*`` metrics and the row order inside DP rank 0 (verl 0.9.1's v0 loop, RayPPOTrainer;
    ``labkit.balance.balance_batch``, the function the planner's balance stage runs)."""
    controls = {
        "ranks": parts.int_box("GPUs (ranks)", ranks, "trainer.n_gpus_per_node"),
        "sp": _sp(sp),
        "n_prompts": parts.int_box("B (prompts)", n_prompts, "data.train_batch_size"),
        "n": parts.int_box("rollout.n", n),
        "lengths": _lengths(lengths, prompt_length + response_length),
        "seed": parts.int_box("seed", seed, "the draw of the length profile"),
    }
    rows = _Rows(seed)

    def redraw(v: dict[str, Any]) -> tuple[str, list | None]:
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
        lens = rows.lengths(cfg, v["lengths"], v["seed"])
        report = check(cfg, max_seq_len=max(lens))
        dp = v["ranks"] // v["sp"]
        text = f"<b>_balance_batch</b>: KK over B·n = {len(lens):,} rows into D = {dp} partitions"
        if not report.ok:  # verl stops before or at _balance_batch (E1, E36, E38 ...)
            return text + verdict_html(report), None
        size = len(lens) // dp
        res = balance_batch.balance_batch(lens, dp)
        before = [sum(lens[r * size : (r + 1) * size]) for r in range(dp)]
        after = [sum(lens[i] for i in part) for part in res.partitions]
        text += f" of {size:,} rows each (equal_size=True)"
        return text, [
            figures.before_after(before, after, "real tokens"),
            balance_figures.metrics_bars(res.metrics),
            balance_figures.rank_rows([lens[i] for i in res.partitions[0]]),
        ]

    return _panel(controls, redraw)
