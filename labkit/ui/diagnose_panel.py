"""The paste box of notebooks 00, 07 and 08: a verl log in a text area, ``labkit diagnose``'s answer under it,
re-read whenever the text changes. One answer is on screen, and it is the user's: while the box is empty it shows the
lesson's example (a real log from a public thread, named as the example, its text as the box's placeholder); once
the user pastes, the answer is of their text alone, and nothing of the example's stays on screen."""

from __future__ import annotations

import html

import ipywidgets as widgets

from labkit.diagnose.answer import Diagnosis, diagnose_text
from labkit.diagnose.log_lines import LogError

PLACEHOLDER = "paste the end of a verl run's log (Ray's prefixes and colours are fine; the config dump helps)"


def answer_html(d: Diagnosis, label: str = "") -> str:
    """The answer as a block of text (its opening memory, phase and config lines first), the verdict line in bold,
    under ``label`` when given."""
    body = "\n".join(
        f"<b>{html.escape(line)}</b>" if line.startswith("diagnosis: ") else html.escape(line)
        for line in d.text().splitlines()
    )
    note = f"<i>{html.escape(label)}</i>\n" if label else ""
    return f"<div style='font-family:monospace;white-space:pre-wrap'>{note}{body}</div>"


def diagnose_box(
    initial: str = "", model: str | None = None, example: str = "", example_source: str = ""
) -> widgets.VBox:
    """A text area for a log and labkit's answer. ``initial`` is the user's log (``YOUR_LOG``); ``example`` is read
    while the area is empty, labelled with ``example_source``. ``box.diagnosis`` holds the answer on screen (None
    when the text could not be read) and ``box.showing`` says whose it is: "yours", "example" or "nothing"."""
    hint = PLACEHOLDER if not example else f"{PLACEHOLDER}. Empty, the box reads the example: {example[:300]}"
    area = widgets.Textarea(value=initial, placeholder=hint, layout=widgets.Layout(width="100%", height="180px"))
    shown = widgets.HTML()
    box = widgets.VBox([area, shown])

    def show(_: object = None) -> None:
        text = area.value if area.value.strip() else example
        box.showing = "yours" if area.value.strip() else "example" if example else "nothing"
        label = (
            f"the example ({example_source}): paste your log above to read yours" if box.showing == "example" else ""
        )
        try:
            box.diagnosis = diagnose_text(text, model=model)
        except LogError as exc:
            box.diagnosis = None
            shown.value = f"<div style='color:#c33'>{html.escape(str(exc))}</div>"
            return
        shown.value = answer_html(box.diagnosis, label)

    area.observe(show, names="value")
    show()
    return box
