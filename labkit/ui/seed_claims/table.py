"""What notebook 09 shows of the checked claims: HTML tables (one per group, one summary) and the verdict counts
as a bar chart. Its own small renderer: cells keep their line breaks and verdict cells are tinted, which
ui.html_table (one colour per row) does not do.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Sequence

import plotly.graph_objects as go

from labkit.ui.figure_style import PLOTLY_MIME
from labkit.ui.figures import PALETTE
from labkit.ui.seed_claims.record import VERDICTS, Result

_CELL = "border:1px solid #ddd;padding:4px 6px;vertical-align:top;text-align:left;white-space:pre-wrap"
BACKGROUND = dict(zip((v.upper() for v in VERDICTS), ("#dff0d8", "#e3f2f1", "#fcebd7", "#f8dcdc", "#ece4dc")))


def html_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain HTML table: every cell escaped, newlines kept, verdict cells tinted."""

    def cell(c: object) -> str:
        tint = f";background:{BACKGROUND[c]}" if isinstance(c, str) and c in BACKGROUND else ""
        return f'<td style="{_CELL}{tint}">{html.escape(str(c))}</td>'

    head = "".join(f'<th style="{_CELL}">{html.escape(str(h))}</th>' for h in header)
    body = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in rows)
    return f'<table style="border-collapse:collapse;font-size:12px"><tr>{head}</tr>{body}</table>'


def groups(results: Sequence[Result]) -> list[str]:
    """The claim groups, in claim order."""
    return list(dict.fromkeys(r.claim.group for r in results))


def _verdict(r: Result) -> str:
    return r.verdict.upper()


def group_html(results: Sequence[Result], group: str, notes: bool = True) -> str:
    """One group's claims: the claim, what it states, what labkit computes, the verdict, verl's location."""
    header = ["id", "claim (about)", "the claim says", "labkit computes", "verdict", "verl (catalogue code)"]
    rows = []
    for r in results:
        if r.claim.group != group:
            continue
        seen = r.observed + ("\n— " + "\n— ".join(r.notes) if notes and r.notes else "")
        rows.append(
            [
                r.claim.id,
                f"{r.claim.text}\n({r.claim.concerns})",
                r.expected,
                seen,
                _verdict(r),
                f"{r.claim.where} ({r.claim.code})",
            ]
        )
    return html_table(header, rows)


def summary_html(results: Sequence[Result]) -> str:
    """Every claim in one line: id, verdict, the claim, the cases that decide it, the catalogue code."""
    rows = [
        [r.claim.id, _verdict(r), r.claim.text, "\n".join(c.line(c.observed) for c in r.deciding) or "—", r.claim.code]
        for r in results
    ]
    return html_table(["id", "verdict", "claim", "cases labkit disagrees with or cannot compute", "code"], rows)


def verdict_counts(results: Sequence[Result]) -> dict[int, dict[str, int]]:
    """Claims per verdict, per post."""
    out: dict[int, dict[str, int]] = {}
    for post in sorted({r.claim.post for r in results}):
        count = Counter(r.verdict for r in results if r.claim.post == post)
        out[post] = {v: count.get(v, 0) for v in VERDICTS}
    return out


def verdict_figure(results: Sequence[Result]) -> go.Figure:
    """Bars: how many claims of each post got each verdict."""
    fig = go.Figure()
    for i, (post, counts) in enumerate(verdict_counts(results).items()):
        fig.add_bar(
            name=f"post {post}",
            x=list(counts),
            y=list(counts.values()),
            marker_color=PALETTE[i],
            text=list(counts.values()),
            textposition="outside",
        )
    fig.update_layout(
        title=f"Verdicts of the {len(results)} claims, computed by labkit",
        xaxis_title="verdict (derived from labkit's computation)",
        yaxis_title="claims (count)",
        barmode="group",
        template="plotly_white",
        height=360,
        margin=dict(l=60, r=20, t=50, b=50),
    )
    return fig


def show(fig: go.Figure) -> None:
    """Display a figure as plotly's mimetype renderer does, without touching plotly.io's renderer registry, which
    imports nbformat and jsonschema (seconds of start-up on a busy machine, for the same output)."""
    from IPython.display import display

    bundle = {
        PLOTLY_MIME: json.loads(fig.to_json()),
        "text/plain": f"<plotly: {fig.layout.title.text}>",
    }
    display(bundle, raw=True)


def verdict_panel(results: Sequence[Result]) -> object:
    """A dropdown of verdicts over the summary table (live kernels only): pick one to see its claims."""
    import ipywidgets as widgets

    pick = widgets.Dropdown(options=["all", *VERDICTS], value="all", description="verdict")
    out = widgets.HTML(summary_html(results))

    def show(change: dict) -> None:
        chosen = [r for r in results if change["new"] in ("all", r.verdict)]
        out.value = summary_html(chosen)

    pick.observe(show, names="value")
    return widgets.VBox([pick, out])
