"""Plotly figures of notebook 12 (Megatron): the rank grid, micro-batches per DP rank, the pipeline schedule per stage
(planned, in time steps, or observed on live ranks, in seconds), activations per stage predicted vs measured, and
the peak per stage. Every figure is built with ``plain_figure`` (no validation: a panel redraw has 100 ms)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from labkit.plan.pipeline_schedule import PipelineSchedule
from labkit.rules.megatron_ranks import MegatronRanks
from labkit.ui.figure_style import PALETTE, hline_spec, plain_figure
from labkit.ui.term_colours import term_colours

KIND = {"F": ("forward", PALETTE[0]), "B": ("backward", PALETTE[1])}
SEND = "#444444"
MIB = 2**20


def rank_grid(ranks: MegatronRanks, title: str = "which GPU holds which (TP, CP, DP, PP) coordinate") -> Any:
    """One cell per global rank: the pipeline stage on the y axis, the ranks of a stage on the x axis (tp fastest,
    then cp, then dp, megatron-core's ``tp-cp-ep-dp-pp`` order), shaded by DP rank, labelled with its coordinates."""
    c, lay = ranks.coords, ranks.layout
    per_stage = lay.world_size // lay.pp
    x, y, z, text = [], [], [], []
    for r in range(lay.world_size):
        x.append(r % per_stage)
        y.append(int(c["pp"][r]))
        z.append(int(c["dp"][r]))
        text.append(f"r{r}<br>tp{c['tp'][r]} cp{c['cp'][r]}<br>dp{c['dp'][r]} ep{c['ep'][r]}")
    trace = {
        "type": "heatmap", "x": x, "y": y, "z": z, "text": text, "texttemplate": "%{text}", "showscale": False,
        "colorscale": [[0, "#DEEBF7"], [1, "#9ECAE1"]], "zmin": 0, "zmax": max(max(z), 1), "xgap": 2, "ygap": 2,
        "textfont": {"color": "#222222"}, "hovertemplate": "%{text}<extra></extra>",
    }  # fmt: skip
    height = max(220, 90 * lay.pp + 100)
    return plain_figure([trace], title, "rank within its pipeline stage", "pipeline stage (PP rank)", height,
                        yaxis={"autorange": "reversed", "dtick": 1}, xaxis={"dtick": 1})  # fmt: skip


def micro_batches_per_dp(counts: Mapping[str, Sequence[int]], title: str = "micro-batches per DP rank") -> Any:
    """Grouped bars: for each setting (label), the micro-batch count of each DP rank."""
    data = []
    for i, (label, per_rank) in enumerate(counts.items()):
        data.append({"type": "bar", "name": label, "x": [f"dp {d}" for d in range(len(per_rank))],
                     "y": list(per_rank), "marker": {"color": PALETTE[i % len(PALETTE)]}})  # fmt: skip
    return plain_figure(data, title, "DP rank", "micro-batches (count)", barmode="group")


LABELLED = 64  # bars per row up to which each is labelled micro-batch.chunk (more would be unreadable specks)


def _bars(rows: Sequence[tuple[str, float, float, str, int, int]], unit: str) -> list[dict]:
    """Two horizontal bar traces (forward, backward) from (y, start, end, kind, micro-batch, chunk) rows; each bar
    labelled micro-batch.chunk while a row holds at most ``LABELLED`` of them."""
    per_row: dict[str, int] = {}
    for r in rows:
        per_row[r[0]] = per_row.get(r[0], 0) + 1
    labelled = max(per_row.values(), default=0) <= LABELLED
    data = []
    for kind, (name, color) in KIND.items():
        sel = [r for r in rows if r[3] == kind]
        data.append({
            "type": "bar", "orientation": "h", "name": name, "marker": {"color": color, "line": {"width": 0.5}},
            "y": [r[0] for r in sel], "base": [r[1] for r in sel], "x": [r[2] - r[1] for r in sel],
            "text": [f"{r[4]}" + (f".{r[5]}" if r[5] else "") for r in sel] if labelled else None,
            "textposition": "inside",
            "insidetextanchor": "middle",
            "hovertext": [f"{name} of micro-batch {r[4]}, chunk {r[5]}: {r[1]:.3g}–{r[2]:.3g} {unit}" for r in sel],
            "hoverinfo": "text",
        })  # fmt: skip
    return data


def schedule_timeline(schedule: PipelineSchedule, title: str | None = None) -> Any:
    """The planned schedule: one row per stage, each forward (blue) and backward (orange) labelled micro-batch.chunk,
    idle where no bar is, and a dark tick where a stage sends an activation or a gradient to its neighbour."""
    rows, sends_x, sends_y = [], [], []
    last_v = schedule.pp * schedule.chunks - 1
    for st in schedule.stages:
        y = f"stage {st.stage}"
        for (kind, mb, c), s, e in zip(st.actions, st.starts, st.ends):
            rows.append((y, s, e, kind, mb, c))
            v = c * schedule.pp + st.stage
            if (kind == "F" and v < last_v) or (kind == "B" and v > 0):
                sends_x.append(e)
                sends_y.append(y)
    data = _bars(rows, "steps")
    data.append({"type": "scatter", "mode": "markers", "name": "send (P2P)", "x": sends_x, "y": sends_y,
                 "marker": {"symbol": "line-ns-open", "size": 14, "color": SEND}, "hoverinfo": "skip"})  # fmt: skip
    kind = "interleaved 1F1B" if schedule.chunks > 1 else ("1F1B" if schedule.pp > 1 else "no pipelining")
    title = title or (
        f"{kind}: PP={schedule.pp}" + (f", VPP={schedule.vpp}" if schedule.chunks > 1 else "")
        + f", {schedule.num_microbatches} micro-batches; bubble {schedule.bubble_fraction:.1%}"
    )  # fmt: skip
    height = 120 + 45 * schedule.pp
    return plain_figure(data, title, "time (one micro-batch's forward through a stage = 1; backward = 2)", "",
                        height, barmode="overlay", yaxis={"autorange": "reversed"}, bargap=0.25)  # fmt: skip


def observed_timeline(live: Any, title: str | None = None) -> Any:
    """What each live rank ran, in seconds from the step's first action: the wait for its input (grey) then the
    forward or backward itself, one row per rank."""
    rows, waits = [], []
    for s in live.stages:
        y = f"rank {s.rank} (stage {s.stage}, dp {s.dp_rank})"
        for a in s.timeline:
            rows.append((y, a["compute_s"], a["end_s"], a["kind"], a["mb"], a["chunk"]))
            if a["compute_s"] > a["start_s"]:
                waits.append((y, a["start_s"], a["compute_s"]))
    data = [{"type": "bar", "orientation": "h", "name": "waiting for its input", "marker": {"color": "#DDDDDD"},
             "y": [w[0] for w in waits], "base": [w[1] for w in waits], "x": [w[2] - w[1] for w in waits],
             "hoverinfo": "skip"}] + _bars(rows, "s")  # fmt: skip
    lay = live.layout
    title = title or f"live on {lay.world_size} CPU ranks: PP={lay.pp}" + (f", VPP={lay.vpp}" if lay.vpp else "") + (
        f", DP={lay.dp_size}, {live.schedule.num_microbatches} micro-batches"
    )
    return plain_figure(data, title, "time since the step's first action (s)", "", 120 + 40 * len(live.stages),
                        barmode="overlay", yaxis={"autorange": "reversed"}, bargap=0.25)  # fmt: skip


def activations_over_step(live: Any, title: str | None = None) -> Any:
    """Saved activations alive after each action, per stage (DP rank 0): predicted (dashed) and measured (solid)."""
    data = []
    for s in (s for s in live.stages if s.dp_rank == 0):
        color = PALETTE[s.stage % len(PALETTE)]
        x = list(range(1, len(s.predicted_bytes) + 1))
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"stage {s.stage} predicted",
                "x": x,
                "y": [b / MIB for b in s.predicted_bytes],
                "line": {"dash": "dash", "color": color, "width": 3},
            }
        )
        data.append({"type": "scatter", "mode": "markers", "name": f"stage {s.stage} measured",
                     "x": list(range(1, len(s.observed_bytes) + 1)), "y": [b / MIB for b in s.observed_bytes],
                     "marker": {"color": color, "size": 7}})  # fmt: skip
    lay = live.layout
    title = title or f"activations held for backward after each action (DP rank 0): PP={lay.pp}" + (
        f", VPP={lay.vpp}" if lay.vpp else "")  # fmt: skip
    return plain_figure(
        data,
        title,
        "action of the stage (forward or backward, in schedule order)",
        "saved activations (MiB)",
    )


def peak_per_stage(live: Any, title: str | None = None) -> Any:
    """Peak saved activations per rank: predicted and measured side by side (MiB), the in-flight count as text
    (chunk-forwards when VPP > 1, micro-batches otherwise)."""
    xs = [f"rank {s.rank}<br>stage {s.stage}" for s in live.stages]
    unit = "chunk-forwards" if (live.layout.vpp or 1) > 1 else "micro-batches"
    data = [
        {"type": "bar", "name": "predicted", "x": xs, "y": [s.predicted_peak_bytes / MIB for s in live.stages],
         "text": [f"{max(s.predicted_in_flight)} {unit}" for s in live.stages], "marker": {"color": PALETTE[4]}},
        {"type": "bar", "name": "measured", "x": xs, "y": [s.observed_peak_bytes / MIB for s in live.stages],
         "text": [f"{max(s.observed_in_flight)} {unit}" for s in live.stages], "marker": {"color": PALETTE[0]}},
    ]  # fmt: skip
    lay = live.layout
    title = title or f"peak activations per rank, plan vs live run: PP={lay.pp}" + (
        f", VPP={lay.vpp}" if lay.vpp else "") + f", DP={lay.dp_size}"  # fmt: skip
    return plain_figure(data, title, "rank", "peak saved activations (MiB)", barmode="group")


def in_flight_per_stage(schedule: PipelineSchedule, title: str | None = None) -> Any:
    """Peak micro-batches in flight per stage (chunk-forwards / V: units of one micro-batch over the stage's layers)."""
    xs = [f"stage {s.stage}" for s in schedule.stages]
    ys = schedule.peak_stage_equivalents
    data = [{"type": "bar", "x": xs, "y": ys, "text": [f"{y:g}" for y in ys], "marker": {"color": PALETTE[2]},
             "name": "in flight"}]  # fmt: skip
    return plain_figure(data, title or "micro-batches whose activations a stage holds at its peak", "pipeline stage",
                        "micro-batches in flight (stage-equivalents)")  # fmt: skip


def stage_peak_terms(phase: Any) -> dict[int, dict[str, int]]:
    """Each stage's terms at its own peak instant, from a Megatron phase whose instants are named ``stage k: …``
    (``labkit.memory.megatron_step.megatron_phases``)."""
    out: dict[int, dict[str, int]] = {}
    for name, terms in phase.instants.items():
        stage = int(name.split(":", 1)[0].removeprefix("stage "))
        if stage not in out or sum(terms.values()) > sum(out[stage].values()):
            out[stage] = dict(terms)
    return dict(sorted(out.items()))


def memory_per_stage(
    terms: Mapping[int, Mapping[str, float]], title: str = "memory per stage at its peak", capacity: int | None = None
) -> Any:
    """Stacked bars: each stage's bytes at its peak by term (GiB), from ``{stage: {term: bytes}}``; a dashed line at
    the GPU's ``capacity`` (bytes) when given."""
    names = sorted({k for t in terms.values() for k in t}, key=lambda n: -max(t.get(n, 0) for t in terms.values()))
    xs, colours = [f"stage {s}" for s in terms], term_colours(names)
    data = [{"type": "bar", "name": n, "x": xs, "y": [terms[s].get(n, 0) / 2**30 for s in terms],
             "marker": {"color": colours[n]}} for n in names]  # fmt: skip
    extra = hline_spec(capacity / 2**30, f"GPU {capacity / 2**30:.0f} GiB") if capacity else {}
    return plain_figure(data, title, "pipeline stage", "memory (GiB)", barmode="stack", **extra)
