"""Figures and a panel for the memory model: stacked bars of each phase's terms (one colour per term, the same in
every figure: ``labkit.ui.term_colours``), predicted bytes per rank and stage, predicted vs measured, and a panel of
number boxes, toggles, a utilisation slider and model/GPU dropdowns that re-answers "why did it OOM?" at once."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from labkit.config.lengths import parse_lengths
from labkit.config.messages import InputError
from labkit.config.verl_config import load_config
from labkit.memory.answer_text import render_text
from labkit.memory.choice import settings_for
from labkit.memory.gpus import gpu_names
from labkit.memory.model_catalogue import model_names
from labkit.memory.settings import MemorySettings
from labkit.memory.settings_keys import compile_key
from labkit.memory.step_memory import phase_of
from labkit.memory.verdict import MemoryReport, memory_report
from labkit.trace import StepTrace
from labkit.ui.figure_style import hline_spec, plain_figure
from labkit.ui.term_colours import term_bars

GiB = 2**30
A, R, REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
SIZES = [  # (override key, label): number boxes, any value
    (f"{R}.log_prob_micro_batch_size_per_gpu", "log-prob micro/GPU"),
    (f"{A}.ppo_micro_batch_size_per_gpu", "update micro/GPU"),
    (f"{R}.log_prob_max_token_len_per_gpu", "log-prob tokens/GPU"),
    (f"{A}.ppo_max_token_len_per_gpu", "update tokens/GPU"),
    ("data.max_prompt_length", "prompt length"),
    ("data.max_response_length", "response length"),
    (f"{A}.ulysses_sequence_parallel_size", "Ulysses SP"),
    (f"{R}.tensor_model_parallel_size", "rollout TP"),
    ("trainer.n_gpus_per_node", "GPUs per node"),
    ("trainer.nnodes", "nodes"),
    ("actor_rollout_ref.model.lora_rank", "LoRA rank (0: off)"),
]
UTILISATION = (f"{R}.gpu_memory_utilization", "gpu_memory_utilization")
DYNAMIC = (f"{A}.use_dynamic_bsz", f"{R}.log_prob_use_dynamic_bsz", f"{REF}.log_prob_use_dynamic_bsz")


def toggles_of(profile: str) -> list[tuple[tuple[str, ...], str, str | None]]:
    """The panel's switches, every knob a fix of the memory answer names: (the keys one sets, its label, the
    ``MemorySettings`` field that reads it with verl's default, or None: the config's first key)."""
    return [
        (("actor_rollout_ref.model.use_fused_kernels",), "fused kernels", "fused_kernels"),
        ((compile_key(profile),), "compiled entropy", "entropy_compiled"),
        ((f"{A}.entropy_from_logits_with_chunking",), "chunked entropy", "entropy_chunking"),
        (DYNAMIC, "dynamic batch size (every pass)", None),
        (
            ("actor_rollout_ref.model.enable_gradient_checkpointing",),
            "gradient checkpointing",
            "gradient_checkpointing",
        ),
        ((f"{A}.fsdp_config.param_offload",), "actor param offload", "param_offload"),
        ((f"{A}.fsdp_config.optimizer_offload",), "actor optimizer offload", "optimizer_offload"),
        ((f"{REF}.fsdp_config.param_offload",), "ref param offload", "ref_param_offload"),
        ((f"{R}.free_cache_engine",), "free_cache_engine", "free_cache_engine"),
    ]


def phase_columns(rep: MemoryReport) -> dict[str, dict[str, int]]:
    """Each phase's terms live at its peak (bytes), by phase."""
    return {name: dict(p.terms) for name, p in rep.phases.items()}


def phase_title(rep: MemoryReport) -> str:
    """The title of a phase chart: the model, then the length assumption the bars were computed with (a second
    line, so the title stays clear of plotly's toolbar)."""
    return f"Peak memory per phase, one GPU ({rep.settings.model.name})<br><sup>{rep.lengths_short}</sup>"


def phase_stack_parts(rep: MemoryReport) -> tuple[list[dict], dict]:
    """The traces and layout of the phase chart (notebook 07's and the dashboard's): the stacked terms, the GPU's
    capacity as a dashed line named in the legend with its basis (a label on the line would sit over the bars), and
    above each phase that does not fit at full width its break-even."""
    s = rep.settings
    cap = s.gpu_bytes / GiB
    key = {"type": "scatter", "x": [None], "y": [None], "mode": "lines", "line": {"dash": "dash", "color": "#444"}}
    key["name"] = f"GPU capacity {cap:,.1f} GiB ({s.capacity_basis})"
    notes = [
        {
            "x": name,
            "y": rep.phases[name].peak_bytes / GiB,
            "xref": "x",
            "yref": "y",
            "yanchor": "bottom",
            "showarrow": False,
            "font": {"size": 11},
            "text": f"fits up to {tokens:,} response tokens",
        }  # fmt: skip
        for name, tokens in rep.break_even.items()
        if tokens and name in rep.phases
    ]
    layout = {
        "barmode": "stack",
        "margin": {"t": 80},
        "legend": {"title": {"text": "term"}},
        "shapes": hline_spec(cap, "")["shapes"],
        "annotations": notes,
    }
    return [*term_bars(phase_columns(rep)), key], layout


def phase_stack(rep: MemoryReport) -> go.Figure:
    """One stacked bar per phase: the terms live at its peak (one colour per term, ``labkit.ui.term_colours``; the
    largest named on the bar), the capacity line and the break-evens (``phase_stack_parts``)."""
    data, layout = phase_stack_parts(rep)
    return plain_figure(data, phase_title(rep), "phase", "GiB per GPU", height=460, **layout)


def rank_stack(trace: StepTrace, stages: Sequence[str], settings: MemorySettings | None = None) -> go.Figure:
    """``bytes_predicted`` of every rank, one group of bars per stage (and ``bytes_measured`` where present). The
    rollout (``generate``) has no rank records in a plan: with ``settings`` its engine phase is drawn on every rank
    (the same share on each); a stage asked for that has neither is a ValueError, never a silent gap."""
    fig = go.Figure()
    ranks = sorted({r.rank for r in trace.ranks})
    for stage in stages:
        recs = trace.at(stage)
        if not recs:
            if stage != "generate" or settings is None or not ranks:
                raise ValueError(f"stage {stage!r} has no rank records in this trace" + (
                    " (pass the settings to draw the rollout engine's share on every rank)" if stage == "generate" else ""
                ))  # fmt: skip
            engine = phase_of(settings, "generate", None).peak_bytes / GiB
            fig.add_bar(name="generate predicted (every rank)", x=ranks, y=[engine] * len(ranks))
            continue
        fig.add_bar(
            name=f"{stage} predicted", x=[r.rank for r in recs], y=[(r.bytes_predicted or 0) / GiB for r in recs]
        )
        if any(r.bytes_measured is not None for r in recs):
            fig.add_bar(
                name=f"{stage} measured", x=[r.rank for r in recs], y=[(r.bytes_measured or 0) / GiB for r in recs]
            )
    fig.update_layout(
        barmode="group", title="Predicted peak per rank and stage", xaxis_title="rank", yaxis_title="GiB per GPU"
    )
    return fig


def measured_bars(checks: Mapping[str, Any]) -> go.Figure:
    """Predicted vs measured bytes above the live state, per pass (``labkit.model.memory_check``)."""
    names = list(checks)
    fig = go.Figure()
    fig.add_bar(name="predicted", x=names, y=[checks[n].predicted_bytes / 2**20 for n in names])
    fig.add_bar(name="measured", x=names, y=[checks[n].measured_bytes / 2**20 for n in names])
    fig.update_layout(
        barmode="group", title="Tiny model on the CPU: predicted vs measured", xaxis_title="pass", yaxis_title="MiB"
    )
    return fig


def report_for(
    overrides: Sequence[str], model: str, gpu_name: str, profile: str = "engine", lengths: str = ""
) -> MemoryReport:
    """The memory report of a config (overrides), a model and a GPU preset, at ``lengths`` (``--lengths``'s forms:
    a profile, L1,L2,... or prompt=P,response=R; empty: every row at full width)."""
    cfg = load_config(None, list(overrides), profile=profile)
    return memory_report(cfg, settings_for(cfg, model, gpu_name), parse_lengths(lengths) if lengths.strip() else None)


def memory_panel(base: Sequence[str], model: str, gpu_name: str, profile: str = "engine") -> Any:
    """Number boxes, switches for every knob the fixes name, the lengths and model/GPU presets; every change
    re-plots the phases and the verdict (arithmetic only); verl's verdict comes first when it rejects the setting,
    and a setting labkit cannot read shows its card instead of the figure. Returns the displayed box."""
    import ipywidgets as W
    from IPython.display import display

    from labkit.ui import panel_parts as parts
    from labkit.ui import widget_outputs as outputs
    from labkit.ui.verdict import verdict_html

    cfg = load_config(None, list(base), profile=profile)
    boxes = {key: parts.int_box(label, cfg.get(key) if cfg.get(key) is not None else 0, key) for key, label in SIZES}
    key, label = UTILISATION
    boxes[key] = W.FloatSlider(
        value=cfg.get(key), min=0.05, max=0.95, step=0.05, description=label, continuous_update=False, style=parts.STYLE
    )
    wide, now = W.Layout(width="auto"), settings_for(cfg, model, gpu_name)
    toggles = {
        keys: W.Checkbox(
            value=bool(getattr(now, field) if field else cfg.get(keys[0])), description=text, indent=False, layout=wide
        )
        for keys, text, field in toggles_of(profile)
    }
    lengths = W.Text(
        value="", description="expected lengths", placeholder="full width; prompt=512,response=2048; a profile", style=parts.STYLE,
        continuous_update=False, layout=W.Layout(width="520px"),
    )  # fmt: skip
    pick_model = W.Dropdown(options=model_names(), value=model, description="model")
    pick_gpu = W.Dropdown(options=gpu_names(), value=gpu_name, description="GPU")
    out = W.Output()

    def redraw(_: Any = None) -> None:
        over = [
            *base,
            *(f"{k}={w.value}" for k, w in boxes.items()),
            *(f"{k}={str(w.value).lower()}" for keys, w in toggles.items() for k in keys),
        ]
        try:
            rep = report_for(over, pick_model.value, pick_gpu.value, profile, lengths.value)
        except InputError as exc:  # a value verl's schema or labkit refuses, lengths it cannot read
            outputs.show(out, outputs.html_output(verdict_html(exc), "verl's verdict"))
            return
        shown = [outputs.figure_output(phase_stack(rep)), outputs.text_output(render_text(rep))]
        if rep.verl_error is not None:  # verl's verdict first; the bars are what the config needs once fixed
            head = f"verl rejects this config ({rep.verl_error}): {rep.verl_message}"
            shown.insert(0, outputs.html_output(f"<b style='color:#c33'>{html.escape(head)}</b>", "verl's verdict"))
        outputs.show(out, *shown)

    for w in [*boxes.values(), *toggles.values(), lengths, pick_model, pick_gpu]:
        w.observe(redraw, names="value")
    redraw()
    sizes = list(boxes.values())
    third = (len(sizes) + 2) // 3
    box = W.VBox(
        [
            W.HBox([pick_model, pick_gpu]),
            W.HBox([parts.column(sizes[i : i + third]) for i in range(0, len(sizes), third)]),
            W.HBox(list(toggles.values()), layout=W.Layout(flex_flow="row wrap")),
            lengths,
            out,
        ]
    )
    display(box)
    return box


def trace_for(overrides: Sequence[str], model: str, phase: str, gpu_name: str = "H100-80GB") -> dict[str, Any]:
    """The formula's phase and a fake-CUDA trace of its largest micro-batch (``labkit memory --trace``): the trace
    result, the formula's pass terms at its peak, and formula / trace."""
    from labkit.memory.trace_compare import trace_spec, transient_terms
    from labkit.model.trace_runner import run_trace

    rep = report_for(overrides, model, gpu_name)
    p = rep.phases[phase]
    spec = trace_spec(rep.settings, phase, p)
    result = run_trace(spec.pop("model"), **spec)
    terms = transient_terms(p)
    return {
        "phase": phase,
        "spec": spec,
        "result": result,
        "formula": terms,
        "ratio": sum(terms.values()) / max(1, result["peak_bytes"]),
    }


def trace_figure(traced: Mapping[str, Any]) -> go.Figure:
    """Two stacked bars in GiB: the formula's pass terms at its peak (each in its term's colour), and the tensors
    alive at the traced peak (the largest eight by op, dtype and shape; the rest as one block), in colours no term
    of the figure has."""
    alive = traced["result"]["alive"]
    trace = {f"{a['op']} {a['dtype'].removeprefix('torch.')} {tuple(a['shape'])}": a["bytes"] for a in alive[:8]}
    trace["every smaller tensor"] = traced["result"]["peak_bytes"] - sum(a["bytes"] for a in alive[:8])
    formula = dict(traced["formula"])
    legend = {**{t: f"formula: {t}" for t in formula}, **{t: f"trace: {t}" for t in trace}}
    title = (
        f"{traced['phase']}: formula vs fake-CUDA trace at the peak<br><sup>formula / trace {traced['ratio']:.2f}; "
        f"traced peak at {traced['result']['op']} in {traced['result']['module']}</sup>"
    )
    return plain_figure(
        term_bars({"formula": formula, "trace": trace}, legend=legend),
        title,
        "",
        "GiB above the weights",
        height=460,
        barmode="stack",
        margin={"t": 80},
    )
