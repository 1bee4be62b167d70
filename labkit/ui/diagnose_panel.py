"""The paste box of notebooks 00, 07 and 08: a verl log in a text area, ``labkit diagnose``'s answer under it,
re-read whenever the text changes."""

from __future__ import annotations

import html

import ipywidgets as widgets

from labkit.diagnose.answer import Diagnosis, diagnose_text
from labkit.diagnose.log_lines import LogError

PLACEHOLDER = "paste the end of a verl run's log (Ray's prefixes and colours are fine; the config dump helps)"


def answer_html(d: Diagnosis) -> str:
    """The answer as a block of text, its first line (kind and phase) in bold."""
    head, *rest = d.text().splitlines()
    body = "\n".join(html.escape(line) for line in rest)
    return f"<div style='font-family:monospace;white-space:pre-wrap'><b>{html.escape(head)}</b>\n{body}</div>"


def diagnose_box(initial: str = "", model: str | None = None) -> widgets.VBox:
    """A text area for a log and labkit's answer; ``box.diagnosis`` holds the last answer (None when the text could
    not be read)."""
    area = widgets.Textarea(value=initial, placeholder=PLACEHOLDER, layout=widgets.Layout(width="100%", height="180px"))
    shown = widgets.HTML()
    box = widgets.VBox([area, shown])

    def show(_: object = None) -> None:
        try:
            box.diagnosis = diagnose_text(area.value, model=model)
        except LogError as exc:
            box.diagnosis = None
            shown.value = f"<div style='color:#c33'>{html.escape(str(exc))}</div>"
            return
        shown.value = answer_html(box.diagnosis)

    area.observe(show, names="value")
    show()
    return box
