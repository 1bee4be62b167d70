"""The planner's three tables as HTML for a notebook: stages at a glance, ranks, summary (rows from
``labkit.plan.tables``, the same ones ``labkit plan`` prints in a terminal)."""

from __future__ import annotations

import html

from labkit.plan import tables
from labkit.trace import StepTrace
from labkit.ui.html_table import html_table
from labkit.validate.report import Report

BEFORE_STEP = ("start-up", "worker init")  # a verl error raised there stops the run before any stage of step 1

__all__ = ["stage_table_html", "rank_table_html", "summary_table_html"]


def stage_table_html(trace: StepTrace, report: Report | None = None) -> str:
    """One row per stage (red where verl stops): global count, per-rank rows, micro-batches, tokens, the rule.

    Nothing after the stage where verl stops is shown as planned: the rows end there, with a line that says so.
    ``report``: verl's verdict on the same config; when verl stops before step 1 (at start-up or worker init), no
    stage runs, and a line says so instead of the table."""
    first = report.first_error if report is not None else None
    if first is not None and first.when in BEFORE_STEP:
        return (
            f"<div class='labkit-pipeline-stopped' style='color:#c33;font-size:12px'>{html.escape(tables.stage_title(trace))}"
            f": verl stops at {html.escape(first.when)} ({html.escape(first.code)}), before step 1: no stage runs, "
            "nothing is planned.</div>"
        )
    rows = tables.stage_rows(trace)
    stop = next((i for i, r in enumerate(rows) if r.stops), None)
    shown = rows if stop is None else rows[: stop + 1]
    table = html_table(
        [r.cells for r in shown],
        [c for c, _ in tables.STAGE_COLUMNS],
        tables.stage_title(trace),
        moods=["error" if r.stops else None for r in shown],
    )
    if stop is None or stop == len(rows) - 1:
        return table
    after = ", ".join(r.cells[1] for r in rows[stop + 1 :])
    return table + (
        f"<div class='labkit-pipeline-stopped' style='color:#666;font-size:12px;font-style:italic'>not run: "
        f"{html.escape(after)} (verl stops at {html.escape(rows[stop].cells[1])}, nothing after it is planned)</div>"
    )


def rank_table_html(trace: StepTrace) -> str:
    """Per-rank rows per stage, consecutive identical ranks grouped."""
    return html_table(tables.rank_rows(trace), [c for c, _ in tables.RANK_COLUMNS], tables.RANK_TITLE)


def summary_table_html(trace: StepTrace) -> str:
    """The key numbers of the step and where verl stops."""
    rows = tables.summary_rows(trace)
    return html_table(
        [(what, value) for what, value, _ in rows], ["what", "value"], "Summary", moods=[m for *_, m in rows]
    )
