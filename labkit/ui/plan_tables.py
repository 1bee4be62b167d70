"""The planner's three tables as HTML for a notebook: stages at a glance, ranks, summary (rows from
``labkit.plan.tables``, the same ones ``labkit plan`` prints in a terminal)."""

from __future__ import annotations

from labkit.plan import tables
from labkit.trace import StepTrace
from labkit.ui.html_table import html_table

__all__ = ["stage_table_html", "rank_table_html", "summary_table_html"]


def stage_table_html(trace: StepTrace) -> str:
    """One row per stage (red where verl stops): global count, per-rank rows, micro-batches, tokens, the rule."""
    rows = tables.stage_rows(trace)
    return html_table(
        [r.cells for r in rows],
        [c for c, _ in tables.STAGE_COLUMNS],
        tables.stage_title(trace),
        moods=["error" if r.stops else None for r in rows],
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
