"""What the start-here dashboard displays for one ``dashboard_state.State``, as HTML strings and figure specs (a
``View``), so the widgets, a headless notebook run and the tests all show the same thing.

A config labkit cannot read, or one verl rejects, gets its verdict and nothing else: every figure is replaced by a
line that points at the verdict, so no figure of an earlier config stays on screen.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from labkit.ui import dashboard_figures as F
from labkit.ui.dashboard_state import State, final
from labkit.ui.suite import notebook_for_code, panel_links
from labkit.ui.verdict import verdict_html

SECTIONS = ("verdict", "pipeline", "ranks", "memory", "hangs")
TITLES = {
    "verdict": "verl's verdict",
    "pipeline": "Pipeline: what every stage holds",
    "ranks": "Per DP rank: rows, tokens, micro-batches",
    "memory": "Memory per phase and the OOM verdict",
    "hangs": "Hang risks",
}


@dataclass
class View:
    """Every part of the dashboard for one state; ``ranks`` and ``memory`` are figure specs (None: no figure)."""

    status: str
    verdict: str
    pipeline: str
    ranks: dict | None
    memory: dict | None
    memory_text: str
    hangs: str
    tokens_deferred: bool = False
    pending: bool = False

    @property
    def figures(self) -> list[dict]:
        return [f for f in (self.ranks, self.memory) if f is not None]


def note(text: str) -> str:
    """A line shown where a figure or table would be."""
    return f"<div class='labkit-dash-note' style='color:#666;font-style:italic'>{html.escape(text)}</div>"


def heading(section: str) -> str:
    """A section's title and the notebooks that explain it."""
    return (
        f"<h4 style='margin:10px 0 2px 0'>{html.escape(TITLES[section])}</h4>"
        f"<div style='font-size:12px'>{panel_links(section)}</div>"
    )


def _read_list(st: State) -> str:
    """What the reader took from the text, and what it could not: the overrides of keys labkit models, the
    arguments not read with why, the variables assumed unset (nothing for a YAML document)."""
    read = st.read
    if read is None or read.kind == "yaml":
        return ""
    rows = [f"<li><code>{html.escape(o)}</code></li>" for o in read.modelled()]
    other = len(read.overrides) - len(rows)
    if other:
        rows.append(f"<li>{other:,} more override(s) of keys labkit does not model</li>")
    rows += [f"<li>not read: <code>{html.escape(arg)}</code>: {html.escape(why)}</li>" for arg, why in read.not_read]
    if read.script is not None and read.script.assumed:
        rows.append(f"<li>{html.escape(read.script.assumed_line())}</li>")
    return (
        "<details class='labkit-dash-read' style='font-size:12px;color:#555'>"
        f"<summary>what labkit read: {html.escape(read.head())}</summary><ul>{''.join(rows)}</ul></details>"
    )


def _status(st: State, pending: bool) -> str:
    parts = [st.read.head()] if st.read is not None else ["labkit cannot read the text"]
    if st.cfg is not None:
        geo = st.run.geometry
        pad = f" + {geo.padding_rows:,} v1 padding rows" if geo.padding_rows else ""
        loop = f", {geo.loop} loop" if geo.loop != "legacy" else ""
        lay = geo.parallel
        mesh = f"TP·PP·CP = {lay.tp}·{lay.pp}·{lay.cp}, " if lay.is_megatron else ""
        parts.append(
            f"B·n = {geo.prompts:,}·{geo.rollout_n:,} = {geo.prompts * geo.rollout_n:,} samples{pad} on "
            f"W = {geo.world_size:,} GPUs ({lay.engine}: {mesh}D = {geo.dp_size:,}), {st.cfg.profile} profile{loop}"
        )
        rel = st.cfg.release
        if rel is not None:
            parts.append(f"as verl {rel.version} runs it" + "".join(f"; {d}" for d in rel.differences))
        parts.extend(f"verl's Hydra would stop first: {stop}" for stop in st.cfg.hydra_stops)
    if pending:
        parts.append("planning step 1 per rank…")
    elif "total" in st.timings_ms:
        slow = ", ".join(f"{k} {v:,.0f}" for k, v in st.timings_ms.items() if k != "total" and v >= 1)
        parts.append(f"computed in {st.timings_ms['total']:,.0f} ms" + (f" ({slow})" if slow else ""))
    return f"<div style='font-size:12px;color:#555'>{html.escape(' · '.join(parts))}</div>" + _read_list(st)


def _verdict(st: State) -> str:
    cards = "".join(verdict_html(item) for item in st.verdict_items)
    code = getattr(getattr(st.report, "first_error", None), "code", None) or next(
        (e["code"] for e in st.stage_errors.values()), None
    )
    if code is not None:
        cards += (
            f"<div style='font-size:12px'>{html.escape(code)} is shown in {notebook_for_code(code).link_html()}</div>"
        )
    return cards


def _why_no_figure(st: State, pending: bool) -> str | None:
    if st.error is not None and st.report is None:
        return "labkit cannot read this config: see the verdict above."
    if st.report is not None and st.report.first_error is not None:
        return f"verl rejects this config ({st.report.first_error.code}): no step to draw, see the verdict above."
    if pending:
        return "planning…"
    if st.error is not None:
        return f"no per-rank plan: {st.error}"
    if st.too_large is not None:
        return f"no per-rank plan: {st.too_large}"
    if st.stage_errors:
        stage, err = next(iter(st.stage_errors.items()))
        return f"verl stops at {stage} ({err['code']}): see the verdict above."
    return None


def render(st: State, metric: str = "tokens", pending: bool = False) -> View:
    """The view of ``st``; ``pending``: only ``quick`` ran so far (the plan is on its way)."""
    pending = pending and not final(st)
    why = _why_no_figure(st, pending)
    trace_ok = st.trace is not None and not (st.report and st.report.first_error) and not pending
    pipeline = F.pipeline_html(st.trace) if trace_ok else note(why or "no plan")
    figures_ok = why is None and st.trace is not None
    ranks = F.rank_bars(st.trace, metric) if figures_ok else None
    if st.memory is not None and not pending:
        memory, memory_text = F.memory_figure(st.memory), F.memory_html(st.memory, st.memory_error)
    else:
        memory, memory_text = None, note(st.memory_error or why or "no memory model")
    if not st.risks and (pending or st.trace is None):
        hangs = note(why or "")
    elif not st.risks and st.tokens_deferred:
        hangs = note("(a) and (b) depend on the tokens each DP rank holds: checked once the tokens are planned.")
    else:
        hangs = F.hangs_html(st.risks, st.dynamic, st.lengths is not None)
        if st.dynamic and st.lengths is not None:
            hangs += note(
                f"One draw of {st.inputs.lengths} (seed {st.inputs.seed}); the chance over 64 draws: "
                f"labkit check CONFIG --lengths {st.inputs.lengths}"
            )
    return View(
        status=_status(st, pending),
        verdict=_verdict(st),
        pipeline=pipeline,
        ranks=ranks,
        memory=memory,
        memory_text=memory_text,
        hangs=hangs,
        tokens_deferred=st.tokens_deferred and not pending,
        pending=pending,
    )


def show(view: View) -> None:
    """Display a view as plain notebook outputs (a headless run: no widgets), section by section."""
    from IPython.display import HTML, display

    display(HTML(view.status + view.verdict))
    parts: dict[str, list[Any]] = {
        "pipeline": [view.pipeline],
        "ranks": [view.ranks or note("no figure: see the verdict")],
        "memory": [view.memory, view.memory_text],
        "hangs": [view.hangs],
    }
    for section, items in parts.items():
        display(HTML(heading(section)))
        for item in items:
            if isinstance(item, dict):
                display(F.mime_bundle(item)["data"], raw=True)
            elif item:
                display(HTML(item))
