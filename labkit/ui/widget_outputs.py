"""What an ipywidgets ``Output`` shows, set as its ``outputs`` state instead of captured with ``with out:``.

Why: a capture (``with out:``, ``out.clear_output()``) makes a headless client such as papermill's (nbclient's
``OutputWidget`` mimic) answer every captured output with a ``comm_msg`` sent on the kernel's shell socket, from its
IOPub task, while its reply task waits on that same socket. A send on a ZeroMQ socket can consume the socket's
edge-triggered read wake-up, so a cell's ``execute_reply`` that arrives then is never read: the kernel is idle,
the reply sits in the client's socket, and the run hangs (about one run in six of notebook 03 did). Setting
``outputs`` sends the state kernel -> client over IOPub only; JupyterLab renders it the same way.
"""

from __future__ import annotations

import json
from typing import Any

from labkit.ui.figure_style import PLOTLY_MIME


def figure_output(fig: Any) -> dict:
    """A plotly figure (``go.Figure`` or a ``FigureSpec``/plain spec dict) as one notebook output: plotly's mime
    bundle, built without plotly.io's renderers (they import nbformat and jsonschema: seconds on a busy machine)."""
    if isinstance(fig, dict):
        from plotly.io.json import to_json_plotly

        spec, title = json.loads(to_json_plotly(dict(fig))), fig.get("layout", {}).get("title", {}).get("text")
    else:
        spec, title = json.loads(fig.to_json()), fig.layout.title.text
    return {"output_type": "display_data", "data": {PLOTLY_MIME: spec, "text/plain": title or "figure"}, "metadata": {}}


def html_output(html: str, plain: str = "") -> dict:
    return {"output_type": "display_data", "data": {"text/html": html, "text/plain": plain or "html"}, "metadata": {}}


def text_output(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text if text.endswith("\n") else text + "\n"}


def show(out: Any, *outputs: dict) -> None:
    """Replace what ``out`` (an ``ipywidgets.Output``) shows with ``outputs``, in one state update (no flicker)."""
    out.outputs = tuple(outputs)
