"""The start-here dashboard's parts, drawn from one ``dashboard_state.State``: the pipeline table, per-DP-rank bars,
memory per phase with the OOM verdict, and the hang risks.

Figures are plotly JSON specs (``labkit.ui.figure_style.plain_figure`` inside ``specs()``: no validation, no template
copy), shown through plotly's mime type; the pipeline table is ``labkit plan``'s (``labkit.ui.plan_tables``).
"""

from __future__ import annotations

import html
from typing import Any

from labkit.memory.answer_text import break_even_line, not_priced_lines, way_out_lines
from labkit.trace import StepTrace
from labkit.ui.figure_style import PALETTE, PLOTLY_MIME, FigureSpec, plain_figure, specs
from labkit.ui.html_table import html_table
from labkit.ui.memory_figures import phase_stack_parts, phase_title
from labkit.ui.plan_tables import stage_table_html

GiB = 2**30
METRICS = {  # RankRecord field -> axis title (with its unit)
    "tokens": "real tokens per DP rank",
    "rows": "rows (samples) per DP rank",
    "padded_tokens": "tokens through the forward per DP rank",
    "n_micro": "micro-batches per DP rank",
}


def _spec(data: list[dict], title: str, x: str, y: str, height: int = 340, **layout: Any) -> FigureSpec:
    with specs():
        return plain_figure(data, title, x, y, height=height, **layout)


def mime_bundle(spec: dict) -> dict:
    """A notebook output of one figure spec (what ``Output.outputs`` and ``display(..., raw=True)`` take)."""
    title = spec["layout"].get("title", {}).get("text", "figure")
    return {"output_type": "display_data", "data": {PLOTLY_MIME: spec, "text/plain": title}, "metadata": {}}


def pipeline_html(trace: StepTrace) -> str:
    """The stages at a glance, as ``labkit plan`` prints them (red where verl stops)."""
    return stage_table_html(trace)


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
    return _spec(data, title, "DP rank (dp_rank)", METRICS[metric], barmode="group")


def memory_figure(rep: Any) -> dict:
    """One stacked bar per phase (the terms live at its peak, GiB per GPU, one colour per term as in every figure of
    the lab, the largest named on the bar), the GPU's capacity and the break-evens, as notebook 07 draws them; the
    title says which lengths the bars were computed with."""
    data, layout = phase_stack_parts(rep)
    return _spec(data, phase_title(rep), "phase", "GiB per GPU", height=460, **layout)


def memory_html(rep: Any, note: str | None = None) -> str:
    """The OOM verdict (the first phase over the GPU, by how much) and the fixes, each with its new peak."""
    s = rep.settings
    esc = html.escape
    head = (
        f"{esc(s.model.name)} on {s.world_size:,} GPUs of {s.gpu_bytes / GiB:,.1f} GiB {esc(s.capacity_basis)} "
        f"({s.profile} profile). "
    )
    tight = {n: rep.state(n)[1] for n in rep.phases if rep.state(n)[0] == "tight"} if rep.first_oom is None else {}
    if rep.first_oom is None and not tight:
        out = [f"<div>{head}<b style='color:#2a7'>Every phase fits</b> (margin {s.margin_bytes / GiB:,.1f} GiB).</div>"]
    elif rep.first_oom is None:
        left = ", ".join(f"{esc(n)} leaves {v / GiB:,.2f} GiB" for n, v in tight.items())
        out = [
            f"<div class='labkit-oom'>{head}<b style='color:#c80'>Tight:</b> {left}, under the margin of "
            f"{s.margin_bytes / GiB:,.1f} GiB.</div>"
        ]
    else:
        p = rep.phases[rep.first_oom]
        over = p.peak_bytes - s.gpu_bytes
        why = f"over the GPU by {over / GiB:,.2f} GiB" if over > 0 else "its engine cannot start"
        big = next(iter(p.terms), "?")
        out = [
            f"<div class='labkit-oom'>{head}<b style='color:#c33'>OOM: {esc(rep.first_oom)}</b> is the first "
            f"phase that does not fit: {why} (largest term: {esc(big)}).</div>"
        ]
    if rep.verl_error is not None:  # verl's verdict first: the memory is what the config needs once fixed
        out.insert(
            0,
            f"<div class='labkit-oom'><b style='color:#c33'>verl rejects this config ({esc(rep.verl_error)})</b>: "
            f"{esc(rep.verl_message or '')}. The memory below is what it would need once fixed.</div>",
        )
    if rep.break_even:
        out.append(f"<div>{esc(break_even_line(rep))}</div>")
    if rep.not_priced:
        out.append("<div>" + "<br>".join(esc(line) for line in not_priced_lines(rep.not_priced)) + "</div>")
    if rep.fixes:
        rows = [
            {
                "phase": f["phase"],
                "fix (alone)": f["set"],
                "now": f.get("from", ""),
                "new peak GiB": round(f["new_peak_bytes"] / GiB, 2),
                "phase fits": "yes" if f["fits"] else "no",
                "whole step fits": "yes" if f["step_fits"] else "no",
                "cost": f["cost"],
            }
            for f in rep.fixes[:8]
        ]
        if rows:
            out.append(html_table(rows, caption="Fixes (memory only; the verdict above says whether verl accepts)"))
    together = way_out_lines(rep)
    if together:
        out.append("<div class='labkit-way-out'>" + "<br>".join(esc(line) for line in together) + "</div>")
    out.append(f"<div><i>Memory computed for {esc(rep.lengths)}.</i></div>")
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
