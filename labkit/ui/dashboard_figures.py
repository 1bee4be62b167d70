"""The start-here dashboard's parts, drawn from one ``dashboard_state.State``: the pipeline table, per-DP-rank bars,
memory per phase with the OOM verdict, and the hang risks.

Figures are plain plotly JSON dicts (``{"data", "layout"}``), shown through plotly's mime type: building a
``go.Figure`` validates every property and copies its template, about 40 ms a figure, which an update cannot spend.
``go.Figure(spec)`` turns one into a figure where a notebook wants one.
"""

from __future__ import annotations

import html
from functools import lru_cache
from typing import Any

from labkit.trace import StepTrace
from labkit.ui.figures import PALETTE
from labkit.ui.html_table import html_table

GiB = 2**30
COLORS = [*PALETTE, "#EECA3B", "#BAB0AC", "#1F77B4", "#8C564B", "#17BECF", "#BCBD22"]  # one per memory term
PLOTLY_MIME = "application/vnd.plotly.v1+json"
METRICS = {  # RankRecord field -> axis title (with its unit)
    "tokens": "real tokens per DP rank",
    "rows": "rows (samples) per DP rank",
    "padded_tokens": "tokens through the forward per DP rank",
    "n_micro": "micro-batches per DP rank",
}


@lru_cache(maxsize=1)
def _template() -> dict:
    import plotly.io as pio

    return pio.templates["plotly_white"].to_plotly_json()


def _layout(title: str, x: str, y: str, **more: Any) -> dict:
    return {
        "title": {"text": title},
        "xaxis": {"title": {"text": x}},
        "yaxis": {"title": {"text": y}},
        "template": _template(),
        "height": 340,
        "margin": {"l": 70, "r": 20, "t": 50, "b": 50},
        **more,
    }


def mime_bundle(spec: dict) -> dict:
    """A notebook output of one figure spec (what ``Output.outputs`` and ``display(..., raw=True)`` take)."""
    title = spec["layout"].get("title", {}).get("text", "figure")
    return {"output_type": "display_data", "data": {PLOTLY_MIME: spec, "text/plain": title}, "metadata": {}}


def _span(values: list) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    lo, hi = min(vals), max(vals)
    return f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"


def pipeline_rows(trace: StepTrace) -> list[dict]:
    """One row per stage, as ``labkit plan`` prints it: global count, per rank, micro-batches and tokens, rule."""
    rows = []
    for i, s in enumerate(trace.stages, 1):
        recs = trace.at(s.name)
        unit = "rows" if s.unit == "samples" else s.unit
        stop = s.note.startswith("verl stops")
        rows.append(
            {
                "#": i,
                "stage": s.name + (" ✖" if stop else ""),
                "global": f"{s.global_rows:,} {s.unit}",
                "per rank": "—" if s.per_rank_rows is None else f"{s.per_rank_rows:,} {unit}",
                "micro-batches / rank": _span([r.n_micro for r in recs]) if any(r.micro_batches for r in recs) else "—",
                "tokens / rank": _span([r.tokens for r in recs]) if recs else "—",
                "rule": s.formula + (f"  [{s.note}]" if stop else ""),
            }
        )
    return rows


def pipeline_html(trace: StepTrace) -> str:
    loop = trace.summary.get("loop")
    label = f"{trace.profile} profile" + (f", {loop} loop" if loop in ("v0", "v1") else "")
    return html_table(pipeline_rows(trace), caption=f"Pipeline of one training step ({label})")


def dp_records(trace: StepTrace) -> dict[str, dict[int, Any]]:
    """Per stage, the record of each DP rank (its first SP / TP rank: the others hold the same rows); generate's
    DP rank is the rollout replica."""
    out: dict[str, dict[int, Any]] = {}
    for s in trace.stages:
        per: dict[int, Any] = {}
        for r in trace.at(s.name):
            if r.dp_rank is not None and not r.sp_rank and not r.tp_rank and r.dp_rank not in per:
                per[r.dp_rank] = r
        if per:
            out[s.name] = per
    return out


def _value(rec: Any, metric: str) -> Any:
    return rec.n_micro if metric == "n_micro" else getattr(rec, metric)


def rank_bars(trace: StepTrace, metric: str = "tokens") -> dict:
    """Grouped bars: one group per DP rank, one bar per stage, of ``metric`` (a key of METRICS). Stages without
    that number (no lengths planned, no micro-batches) are left out; with none left, the rows are drawn."""
    per = dp_records(trace)
    shown = {s: recs for s, recs in per.items() if any(_value(r, metric) for r in recs.values())}
    note = ""
    if not shown and metric != "rows":
        shown, note, metric = per, f" ({METRICS[metric].split(' per')[0]} not planned: rows shown)", "rows"
    data = []
    for i, (stage, recs) in enumerate(shown.items()):
        ranks = sorted(recs)
        data.append(
            {
                "type": "bar",
                "name": stage + (" (replica)" if stage == "generate" else ""),
                "x": ranks,
                "y": [_value(recs[d], metric) for d in ranks],
                "marker": {"color": PALETTE[i % len(PALETTE)]},
                "hovertemplate": f"{stage}<br>dp_rank %{{x}}: %{{y:,}}<extra></extra>",
            }
        )
    title = f"Per DP rank and stage: {METRICS[metric].split(' per')[0]}{note}"
    return {"data": data, "layout": _layout(title, "DP rank (dp_rank)", METRICS[metric], barmode="group")}


def memory_figure(rep: Any) -> dict:
    """One stacked bar per phase (the terms live at its peak, GiB per GPU) and the GPU's capacity as a dashed line."""
    names = list(rep.phases)
    terms = list(dict.fromkeys(t for p in rep.phases.values() for t in p.terms))
    data = [
        {
            "type": "bar",
            "name": term,
            "x": names,
            "y": [rep.phases[n].terms.get(term, 0) / GiB for n in names],
            "marker": {"color": COLORS[i % len(COLORS)]},
            "hovertemplate": f"{term}: %{{y:.2f}} GiB<extra></extra>",
        }
        for i, term in enumerate(terms)
    ]
    cap = rep.settings.gpu_bytes / GiB
    line = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": cap, "y1": cap, "line": {"dash": "dash"}}
    note = {"xref": "paper", "x": 1, "y": cap, "text": f"GPU {cap:.0f} GiB", "showarrow": False, "yanchor": "bottom"}
    title = f"Peak memory per phase, one GPU ({rep.settings.model.name}, worst case: every row at full width)"
    return {
        "data": data,
        "layout": _layout(title, "phase", "GiB per GPU", barmode="stack", shapes=[line], annotations=[note]),
    }


def memory_html(rep: Any, note: str | None = None) -> str:
    """The OOM verdict (the first phase over the GPU, by how much) and the fixes, each with its new peak."""
    s = rep.settings
    esc = html.escape
    head = f"{esc(s.model.name)} on {s.world_size:,} GPUs of {s.gpu_bytes / GiB:,.0f} GiB ({s.profile} profile). "
    if rep.first_oom is None:
        out = [f"<div>{head}<b style='color:#2a7'>Every phase fits.</b></div>"]
    else:
        p = rep.phases[rep.first_oom]
        over = p.peak_bytes - s.gpu_bytes
        why = f"over the GPU by {over / GiB:,.2f} GiB" if over > 0 else "its engine cannot start"
        big = next(iter(p.terms), "?")
        out = [
            f"<div class='labkit-oom'>{head}<b style='color:#c33'>OOM: {esc(rep.first_oom)}</b> is the first "
            f"phase that does not fit: {why} (largest term: {esc(big)}).</div>"
        ]
        rows = [
            {
                "phase": f["phase"],
                "fix (alone)": f["set"],
                "new peak GiB": round(f["new_peak_bytes"] / GiB, 2),
                "phase fits": "yes" if f["fits"] else "no",
                "whole step fits": "yes" if f["step_fits"] else "no",
                "cost": f["cost"],
            }
            for f in rep.fixes[:8]
        ]
        if rows:
            out.append(html_table(rows, caption="Fixes (memory only; the verdict above says whether verl accepts)"))
    if note:
        out.append(f"<div><i>{esc(note)}</i></div>")
    return "".join(out)


def hangs_html(risks: list, dynamic: bool, lengths: bool) -> str:
    """Each hang risk on one line, or what was checked when there is none."""
    if risks:
        return "<ul>" + "".join(f"<li class='labkit-hang'>{html.escape(r.line())}</li>" for r in risks) + "</ul>"
    if not dynamic:
        return (
            "<div>No hang risk: (a) and (b) need dynamic micro-batching (use_dynamic_bsz), and no size is "
            "normalised to 0 (c).</div>"
        )
    if not lengths:
        return "<div>(a) and (b) depend on the lengths: choose a length profile to check them.</div>"
    return (
        "<div>No hang risk for these lengths: every DP rank cuts the same number of micro-batches without the "
        "MAX sync (a), none holds fewer rows than the synced count (b), no size is normalised to 0 (c).</div>"
    )
