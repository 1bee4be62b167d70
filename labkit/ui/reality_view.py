"""The "real runs" view of notebook 07: one case of the reality corpus, labkit's phases beside what happened (the
OOM message's figures, or a log's memory counter and lengths) and the source one click away, and a dropdown that
picks the case. It draws what ``labkit.reality.score`` computed (passed in: this layer does not import it)."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import plotly.graph_objects as go

from labkit.ui.figure_style import hline_spec, plain_figure
from labkit.ui.term_colours import term_bars

GiB = 2**30
VERDICT = {"agree": "agrees", "false_alarm": "a false alarm", "miss": "a miss", "refused": "no answer"}


def case_figure(score: Any) -> go.Figure:
    """labkit's phases for the case (stacked terms at each phase's peak, GiB) with the card's capacity; what
    happened beside them: PyTorch's allocated + tried bytes of an OOM (where the message gives them), or a log's
    measured counter next to labkit's predicted one."""
    report = score.answer.report or {}
    columns = {name: dict(p["terms"]) for name, p in report.get("phases", {}).items()}
    traces = term_bars(columns) if columns else []
    c = score.case
    oom = c.oom
    if oom is not None and oom.allocated_gib is not None and oom.tried_gib is not None:
        traces.append(_marker("OOM message: allocated + tried", oom.allocated_gib + oom.tried_gib, columns))
    if score.measured_counter_gib is not None:
        traces.append(_marker("logged max_memory_allocated", score.measured_counter_gib, columns, "#222"))
        if score.predicted_counter_gib is not None:
            traces.append(_marker("labkit's predicted counter", score.predicted_counter_gib, columns, "#c33"))
    capacity = report.get("capacity_bytes", 0) / GiB
    layout = {"barmode": "stack", **(hline_spec(capacity, f"GPU capacity {capacity:.1f} GiB") if capacity else {})}
    title = f"{html.escape(c.id)}: labkit's peak per phase<br><sup>{html.escape(_lengths(score))}</sup>"
    return plain_figure(traces, title, "phase", "GiB on one GPU", height=420, **layout)


def _marker(name: str, gib: float, columns: dict, color: str = "#E45756") -> dict:
    """A horizontal marker line across the phases at ``gib`` (a scatter, so it shows in the legend)."""
    xs = list(columns) or ["(no phase)"]
    return {"type": "scatter", "mode": "lines", "name": name, "x": xs, "y": [gib] * len(xs), "line": {"color": color}}


def _lengths(score: Any) -> str:
    options = list(score.answer.options)
    if "--lengths" in options:
        return f"at --lengths {options[options.index('--lengths') + 1]}"
    return "every row at full width (no lengths known)"


def case_card(score: Any, cause: str | None = None) -> str:
    """The case in words (HTML): what ran and where, what happened, labkit's verdict and whether they agree, the
    command a user types, the known cause of a disagreement, and the source as a link."""
    c = score.case
    happened = "ran" if c.outcome == "ran" else f"ran out of memory in {c.oom.phase if c.oom else 'an unknown phase'}"
    rows = [
        ("source", f"<a href='{html.escape(c.url)}' target='_blank' rel='noopener'>{html.escape(c.url)}</a>"),
        ("what", html.escape(c.summary)),
        ("release", html.escape(f"verl {c.verl} ({c.release_basis})" + (f", {c.fork}" if c.fork else ""))),
        (
            "GPUs",
            html.escape(f"{c.nnodes} × {c.n_gpus_per_node} {c.gpu}" + (f" ({c.gpu_assumed})" if c.gpu_assumed else "")),
        ),
        ("happened", html.escape(happened + (f": {c.oom.message[:240]}" if c.oom and c.oom.message else ""))),
        ("labkit", html.escape(_answered(score))),
        ("verdict", f"<b>{VERDICT[score.agreement]}</b>" + (f" ({html.escape(cause)})" if cause else "")),
        ("command", f"<code>{html.escape(score.answer.command(c.id + '.sh'))}</code>"),
        ("confidence", html.escape(f"{c.confidence}: {c.confidence_why}")),
    ]
    if score.counter_ratio is not None:
        rows.insert(6, ("counter", html.escape(
            f"predicted {score.predicted_counter_gib:.1f} GiB, logged {score.measured_counter_gib:.1f} GiB "
            f"({score.counter_ratio:.2f}×; {c.measured.counter})"
        )))  # fmt: skip
    body = "".join(f"<tr><td style='padding-right:1em'><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows)
    return f"<table style='text-align:left'>{body}</table>"


def _answered(score: Any) -> str:
    if score.verdict == "refused":
        return f"no answer: {score.answer.refusal}"
    if score.verdict == "oom":
        return f"OOM in {score.first_oom} ({score.peaks_gib[score.first_oom]:.1f} GiB)"
    worst = max(score.peaks_gib, key=score.peaks_gib.get)
    unless = " at these lengths, not at full width" if score.verdict == "fits_unless" else ""
    return f"{score.verdict.replace('_unless', '')}{unless} (largest: {worst} {score.peaks_gib[worst]:.1f} GiB)"


def real_runs_panel(case_ids: Sequence[str], score_of: Callable[[str], Any], causes: dict[str, str], first: str) -> Any:
    """A dropdown of the corpus's cases; choosing one draws its figure and card (``score_of``: the case's score,
    ``labkit.reality.score.score`` of ``labkit.reality.corpus.case``)."""
    import ipywidgets as W
    from IPython.display import HTML, display

    pick = W.Dropdown(options=list(case_ids), value=first, description="case", layout=W.Layout(width="60%"))
    out = W.Output()

    def draw(*_: Any) -> None:
        s = score_of(pick.value)
        with out:
            out.clear_output(wait=True)
            display(HTML(case_card(s, causes.get(pick.value))))
            case_figure(s).show()

    pick.observe(draw, names="value")
    draw()
    return W.VBox([pick, out])
