"""One config planned under the three trainer loops labkit models, side by side: ``legacy`` (verl <= 0.7 workers,
RayPPOTrainer), ``v0`` (0.9.1 engine workers, ``trainer.use_v1=false``) and ``v1`` (0.9.1's default loop). Used by
notebook 10 and ``labkit plan`` readers who upgrade; each row names what differs and the numbers of each loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from labkit.config.verl_config import load_config
from labkit.plan.step import plan
from labkit.trace import StepTrace

LOOP_SETTINGS = {"legacy": ("legacy", []), "v0": ("engine", ["trainer.use_v1=false"]), "v1": ("engine", [])}


@dataclass
class LoopComparison:
    """The three plans of one config (``traces[loop]``) and the rows of the side-by-side table."""

    traces: dict[str, StepTrace]
    rows: list[dict[str, Any]]


def _first_stop(tr: StepTrace) -> str:
    errors = tr.summary.get("stage_errors") or {}
    first = tr.summary.get("first_error")
    if first:
        return f"{first['code']} at {first['when']}"
    return ", ".join(f"{e['code']} at {stage}" for stage, e in errors.items()) or "runs"


def _rows_per_rank(tr: StepTrace, stage: str) -> Any:
    rec = next((s for s in tr.stages if s.name == stage), None)
    return None if rec is None else rec.per_rank_rows


def _order_note(tr: StepTrace) -> str:
    bal = next((s for s in tr.stages if s.name == "balance"), None)
    if bal is None:
        return "—"
    if tr.summary.get("loop") == "v1":
        return "KK, always; each rank in completion order (ascending batch index)"
    return "KK; each rank small…large…small" if "small-large-small" in bal.note else "no balancing: contiguous chunks"


def compare_loops(
    overrides: Sequence[str], lengths: Sequence[int] | str | None = None, seed: int = 0
) -> LoopComparison:
    """Plan ``overrides`` under legacy, engine v0 and engine v1 (same lengths) and list every difference."""
    traces = {}
    for loop, (profile, extra) in LOOP_SETTINGS.items():
        traces[loop] = plan(load_config(overrides=[*overrides, *extra], profile=profile), lengths, seed=seed)

    def row(what: str, fn: Any) -> dict[str, Any]:
        return {"what": what, **{loop: fn(tr) for loop, tr in traces.items()}}

    rows = [
        row("trainer loop", lambda t: t.summary["loop_title"]),
        row(
            "driver repeat",
            lambda t: "none (n sessions per prompt)" if t.summary["loop"] == "v1" else "B·n, interleaved",
        ),
        row(
            "agent-loop split",
            lambda t: (
                ",".join(map(str, t.summary["agent_loop"]["prompts_per_worker"])) + " prompts"
                if t.summary["loop"] == "v1"
                else f"{t.summary['agent_loop']['per_worker']} samples each"
            ),
        ),
        row("synthetic padding rows", lambda t: t.summary.get("padding_rows") or 0),
        row("rows in the step", lambda t: t.summary["samples"]),
        row("rows per DP rank", lambda t: _rows_per_rank(t, "balance")),
        row("row order inside a rank", _order_note),
        row("where normalisation happens", _normalisation),
        row("per-rank mini-batch", lambda t: t.summary.get("mini_batches")),
        row("GA (verl's)", lambda t: t.summary.get("ga")),
        row("loss scale", lambda t: t.summary.get("loss_scale")),
        row("token budget", lambda t: "a target" if t.profile == "legacy" else "a hard cap"),
        row("gradient sync", lambda t: "every micro-batch" if t.profile == "legacy" else "last micro-batch"),
        row("first stop", _first_stop),
    ]
    return LoopComparison(traces=traces, rows=rows)


def _normalisation(tr: StepTrace) -> str:
    if tr.profile == "legacy":
        return "worker init: M′ = (M·n)//(W//sp), floor"
    return "update call: (M·n)/D, asserted" + ("; batch padded first" if tr.summary.get("loop") == "v1" else "")


def differing(comparison: LoopComparison) -> list[dict[str, Any]]:
    """The rows whose value is not the same under all three loops."""
    return [r for r in comparison.rows if len({repr(r[loop]) for loop in LOOP_SETTINGS}) > 1]


def format_rows(comparison: LoopComparison, only_differences: bool = False) -> str:
    """The side-by-side table as text, one line per row: ``what  legacy: … | v0: … | v1: …``."""
    rows = differing(comparison) if only_differences else comparison.rows
    return "\n".join(f"{r['what']:28s} " + " | ".join(f"{loop}: {r[loop]}" for loop in LOOP_SETTINGS) for r in rows)
