"""Tables for notebooks as plain escaped HTML with a few lines of inline CSS.

Rich's box-drawing tables wrap and break in a notebook's output area; an HTML table reflows with the page, copies into
a spreadsheet and renders the same in JupyterLab, nbval's HTML and a browser test.
"""

from __future__ import annotations

import html
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["html_table", "cell_text"]
_TABLE = "border-collapse:collapse;font-size:12px;margin:4px 0"
_CELL = "padding:2px 8px;border-bottom:1px solid #ddd;"
_MOODS = {"error": "#c33", "ok": "#2a7"}


def cell_text(value: Any) -> str:
    """How one value prints: None empty, floats to 4 significant digits, everything else ``str``."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def html_table(
    rows: Sequence[Mapping] | Sequence[Sequence],
    columns: Sequence[str] | None = None,
    caption: str | None = None,
    *,
    moods: Sequence[str | None] | None = None,
) -> str:
    """An HTML table of ``rows`` (mappings or sequences). ``columns``: the header, and for mappings the keys to show
    in that order (default: every key, in first-seen order); sequences without ``columns`` get no header.
    Every value is escaped; numbers are right-aligned. ``moods``: per row, "error" (red), "ok" (green) or None."""
    rows = list(rows)
    if columns is None and rows and isinstance(rows[0], Mapping):
        columns = list(dict.fromkeys(k for r in rows for k in r))
    if rows and isinstance(rows[0], Mapping):
        body = [[r.get(c) for c in columns] for r in rows]
    else:
        body = [list(r) for r in rows]
    out = [f"<table class='labkit-table' style='{_TABLE}'>"]
    if caption:
        out.append(f"<caption style='text-align:left;font-weight:bold'>{html.escape(caption)}</caption>")
    if columns:
        head = "".join(f"<th style='{_CELL}text-align:left'>{html.escape(str(c))}</th>" for c in columns)
        out.append(f"<thead><tr>{head}</tr></thead>")
    out.append("<tbody>")
    for i, row in enumerate(body):
        mood = _MOODS.get(moods[i]) if moods else None
        cells = "".join(
            f"<td style='{_CELL}text-align:{'right' if _is_number(v) else 'left'}'>{html.escape(cell_text(v))}</td>"
            for v in row
        )
        out.append(f"<tr style='color:{mood}'>{cells}</tr>" if mood else f"<tr>{cells}</tr>")
    out.append("</tbody></table>")
    return "".join(out)
