"""The look every labkit figure shares (a light template, titles with units) and the fast way to build one.

A panel redraws several figures per change and has 100 ms for all of it; plotly's validation of every property is
most of a figure's cost (0.6 s for 8,192 points, ~30 ms for its own white template). ``plain_figure`` builds a
figure from plain trace and layout dicts without that validation (plotly's own ``_validate=False``, pinned
plotly 7.1); tests/test_panels.py checks each such figure against a validated copy of itself. Inside ``specs()``
(a panel's redraw) it returns the figure's JSON itself, a ``FigureSpec``: plotly's Figure deep-copies its data twice
on the way to the browser, which for a 64-rank stack costs more than the arithmetic.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

PLOTLY_MIME = "application/vnd.plotly.v1+json"  # the mime type JupyterLab's plotly renderer reads
PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D"]
_GRID = {"gridcolor": "#EBF0F8", "zerolinecolor": "#EBF0F8", "linecolor": "#EBF0F8", "automargin": True}
# the look of plotly_white in a few layout keys, as a Template object (plotly_white itself, or plotly's default
# template that applies when none is set, costs 30-40 ms per figure to copy and validate)
LIGHT = go.layout.Template(
    layout={"plot_bgcolor": "white", "paper_bgcolor": "white", "colorway": PALETTE, "xaxis": _GRID, "yaxis": _GRID}
)
_LIGHT_DICT = LIGHT.to_plotly_json()


def merged(base: dict, extra: dict) -> dict:
    """``extra`` laid over ``base``, nested dicts merged key by key (as ``update_layout`` merges)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def layout_spec(title: str, x: str, y: str, height: int = 360, template: Any = LIGHT) -> dict:
    """Title, axis titles (with units), the light template, margins and height."""
    return {
        "title": {"text": title},
        "xaxis": {"title": {"text": x}},
        "yaxis": {"title": {"text": y}},
        "template": template,
        "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
        "height": height,
        "legend": {"title": {"text": ""}},
    }


def set_layout(fig: go.Figure, title: str, x: str, y: str, height: int = 360) -> go.Figure:
    """``layout_spec`` merged into a figure's layout in one assignment (``update_layout`` parses every key path)."""
    fig.layout = go.Layout(merged(fig.layout.to_plotly_json(), layout_spec(title, x, y, height)))
    return fig


def hline_spec(y: float, text: str, color: str | None = "#444") -> dict:
    """Layout keys of a dashed horizontal line across the plot with its label (what ``add_hline`` adds)."""
    shape = {"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y}
    shape["line"] = {"dash": "dash", **({"color": color} if color else {})}
    note = {"text": text, "xref": "x domain", "x": 1, "xanchor": "right", "yref": "y", "y": y, "yanchor": "bottom"}
    return {"shapes": [shape], "annotations": [{**note, "showarrow": False}]}


def hline(fig: go.Figure, y: float, text: str, color: str | None = "#444") -> None:
    """``hline_spec`` added to an existing figure (``add_hline`` costs ~8 ms of subplot logic)."""
    lay, spec = fig.layout.to_plotly_json(), hline_spec(y, text, color)
    for key in ("shapes", "annotations"):
        lay[key] = [*lay.get(key, ()), *spec[key]]
    fig.layout = go.Layout(lay)


_AS_SPECS: ContextVar[bool] = ContextVar("labkit_figure_specs", default=False)


def _display_plotly(spec_json: str) -> None:
    """Display a figure's JSON as plotly's mime bundle in a notebook kernel (outside one there is nowhere to draw)."""
    from IPython import get_ipython
    from IPython.display import display

    if get_ipython() is not None:
        display({PLOTLY_MIME: json.loads(spec_json)}, raw=True)


class Figure(go.Figure):
    """A plotly Figure that ``show()`` (and a cell's last value) displays as plotly's mime bundle directly: plotly.io's
    renderers import nbformat and jsonschema on first use, 3 s on a quiet core and 7-10 s on busy ones, per kernel."""

    def show(self, *args: Any, **kwargs: Any) -> None:
        _display_plotly(self.to_json())

    def _ipython_display_(self) -> None:
        _display_plotly(self.to_json())


class FigureSpec(dict):
    """A figure as plotly.js reads it (``data``, ``layout``), shown without building a ``go.Figure``."""

    def to_json(self) -> str:
        return pio.json.to_json_plotly(dict(self))

    def figure(self) -> go.Figure:
        """The validated plotly Figure of this spec."""
        return Figure(dict(self))

    def show(self) -> None:
        _display_plotly(self.to_json())


@contextmanager
def specs() -> Iterator[None]:
    """Inside this block ``plain_figure`` returns ``FigureSpec`` (a panel's redraw)."""
    token = _AS_SPECS.set(True)
    try:
        yield
    finally:
        _AS_SPECS.reset(token)


def plain_figure(data: list[dict], title: str, x: str, y: str, height: int = 360, **layout: Any) -> go.Figure:
    """A figure from trace dicts (``{"type": "bar", ...}``) and extra layout keys, without plotly's validation."""
    spec = merged(layout_spec(title, x, y, height, _LIGHT_DICT), layout)
    if _AS_SPECS.get():
        return FigureSpec(data=data, layout=spec)
    return Figure(data=data, layout=spec, _validate=False)


def validated(fig: go.Figure | FigureSpec) -> go.Figure:
    """The same figure through plotly's validation (tests: a plain figure must survive it unchanged)."""
    return go.Figure(dict(fig) if isinstance(fig, FigureSpec) else fig.to_plotly_json())
