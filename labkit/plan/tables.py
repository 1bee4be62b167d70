"""The three tables of a planned (or live) step as plain rows: the stages at a glance, the ranks, the summary.

``labkit plan`` draws them with Rich in a terminal, the notebooks as HTML (``labkit.ui.plan_tables``); both read the
same rows, so the terminal and the notebook show the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.trace import RankRecord, StepTrace

STAGE_COLUMNS = (
    ("#", "right"),
    ("stage", "left"),
    ("global", "right"),
    ("per rank", "right"),
    ("micro-batches / rank", "right"),
    ("tokens / rank", "right"),
    ("rule", "left"),
)
RANK_TITLE = "Per rank (identical consecutive ranks grouped)"
RANK_COLUMNS = (
    ("stage", "left"),
    ("ranks", "left"),
    ("mesh coordinates", "left"),
    ("rows", "right"),
    ("tokens", "right"),
    ("micro-batches", "left"),
    ("mini-batches (rows)", "left"),
    ("collectives", "left"),
)


@dataclass(frozen=True)
class StageRow:
    """One stage's cells (in ``STAGE_COLUMNS`` order); ``stops``: verl stops at this stage."""

    cells: tuple[str, ...]
    stops: bool


def span(values: list) -> str:
    """ "3" or "3–5" over the values that are not None (thousands separated); "—" when there are none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    lo, hi = min(vals), max(vals)
    return f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"


def _rank_key(r: RankRecord) -> tuple:
    return (
        r.rows,
        r.tokens,
        r.padded_tokens,
        tuple(m.rows for m in r.micro_batches),
        tuple(m.tokens for m in r.micro_batches),
        tuple(r.mini_batches),
        tuple(sorted(r.collectives.items())),
        r.tp_rank if r.stage == "generate" else None,
    )


def rank_groups(recs: list[RankRecord]) -> list[list[RankRecord]]:
    """Runs of consecutive ranks whose records are identical (apart from their mesh coordinates)."""
    out: list[list[RankRecord]] = []
    for r in recs:
        if out and _rank_key(out[-1][-1]) == _rank_key(r) and out[-1][-1].rank == r.rank - 1:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def _coord(values: list) -> str:
    vals = sorted({v for v in values if v is not None})
    if not vals:
        return "·"
    return str(vals[0]) if len(vals) == 1 else f"{vals[0]}–{vals[-1]}"


def _coords(group: list[RankRecord]) -> str:
    """A run's mesh coordinates: Megatron's ``dp tp cp pp`` (from ``extra["megatron"]``), else ``dp tp sp``."""
    if "megatron" in group[0].extra:
        return " ".join(f"{k}{_coord([g.extra['megatron'][k] for g in group])}" for k in ("dp", "tp", "cp", "pp"))
    names = (("dp", "dp_rank"), ("tp", "tp_rank"), ("sp", "sp_rank"))
    return " ".join(f"{k}{_coord([getattr(g, f) for g in group])}" for k, f in names)


def _micro_text(r: RankRecord) -> str:
    if not r.micro_batches:
        return "—"
    rows = [m.rows for m in r.micro_batches]
    head = f"{len(rows)} micro-batches × {span(rows)} rows"
    toks = [m.tokens for m in r.micro_batches]
    if all(t is not None for t in toks):
        head += f", {span(toks)} tokens each"
    return head


def stage_title(tr: StepTrace) -> str:
    loop = tr.summary.get("loop")
    label = f"{tr.profile} profile" + (f", {loop} loop" if loop in ("v0", "v1") else "")
    return f"Pipeline at a glance ({label})"


def stage_rows(tr: StepTrace) -> list[StageRow]:
    """One row per stage: #, name, global count, per-rank rows, micro-batches and tokens per rank, the rule."""
    out = []
    for i, s in enumerate(tr.stages, 1):
        recs = tr.at(s.name)
        per = "—" if s.per_rank_rows is None else f"{s.per_rank_rows:,} {'rows' if s.unit == 'samples' else s.unit}"
        micro = span([r.n_micro for r in recs]) if any(r.micro_batches for r in recs) else "—"
        toks = span([r.tokens for r in recs]) if recs else "—"
        stops = s.note.startswith("verl stops")
        rule = s.formula + (f"  [{s.note}]" if stops else "")
        out.append(StageRow((str(i), s.name, f"{s.global_rows:,} {s.unit}", per, micro, toks, rule), stops))
    return out


def rank_rows(tr: StepTrace) -> list[tuple[str, ...]]:
    """Per stage, one row per run of identical consecutive ranks (``RANK_COLUMNS`` order)."""
    out = []
    for s in tr.stages:
        for group in rank_groups(tr.at(s.name)):
            r = group[0]
            coords = _coords(group)
            out.append(
                (
                    s.name,
                    _coord([g.rank for g in group]),
                    coords,
                    f"{r.rows:,}",
                    "—" if r.tokens is None else f"{r.tokens:,}",
                    _micro_text(r),
                    ", ".join(str(x) for x in r.mini_batches) or "—",
                    ", ".join(f"{k}×{v}" for k, v in r.collectives.items()) or "—",
                )
            )
    return out


def _layout_row(s: dict) -> tuple[str, Any, str | None]:
    """The training layout: W / D / Ulysses sp (FSDP), or W / D / TP·PP·CP with VPP and EP (Megatron)."""
    m = s.get("megatron")
    if not m:
        return ("GPUs W / actor DP D / Ulysses sp", f"{s.get('W')} / {s.get('D')} / {s.get('sp')}", None)
    extra = "".join(f", {k.upper()} {m[k]}" for k in ("vpp", "ep") if m.get(k) and m[k] > 1)
    text = f"{s.get('W')} / {s.get('D')} / {m['tp']}·{m['pp']}·{m['cp']}{extra}"
    return ("GPUs W / actor DP D / Megatron TP·PP·CP", text, None)


def _schedule_rows(s: dict) -> list[tuple[str, Any, str | None]]:
    """Megatron: the update's pipeline schedule (megatron-core's function, bubble, micro-batches in flight per
    stage), or the schedule check that fails."""
    sched = (s.get("megatron") or {}).get("schedule")
    if not sched:
        return []
    if "error" in sched:
        return [("pipeline schedule (update)", sched["error"], "error")]
    flight = ", ".join(str(st["peak_in_flight"]) for st in sched["stages"])
    return [
        ("pipeline schedule (update)", f"{sched['function']}, {sched['micro_batches']} micro-batches", None),
        ("bubble (idle share of the update)", f"{sched['bubble_fraction']:.1%}", None),
        ("forwards in flight at the peak, per stage (chunks with VPP)", flight, None),
    ]


def summary_rows(tr: StepTrace) -> list[tuple[str, Any, str | None]]:
    """(what, value, mood): the key numbers of the step, then where verl stops (mood "error") or "ok"."""
    s = tr.summary
    rows: list[tuple[str, Any, str | None]] = [
        ("trainer loop", s.get("loop_title"), None),
        _layout_row(s),
        *_schedule_rows(s),
        ("rollout tp / replicas R / agent workers A", f"{s.get('tp')} / {s.get('R')} / {s.get('A')}", None),
        ("prompts B × n = samples", f"{s.get('B')} × {s.get('n')} = {s.get('generated_samples')} samples", None),
    ]
    if s.get("loop") == "v1" and s.get("required_multiple"):
        split = ",".join(map(str, s["agent_loop"]["prompts_per_worker"]))
        pad = f"{s.get('padding_rows')} (multiple {s.get('required_multiple')}) → {s.get('samples')} rows"
        rows += [("agent-loop split (prompts per worker)", split, None), ("v1 synthetic padding rows", pad, None)]
    rows += [
        ("normalized mini-batch (rows per rank)", s.get("mini_normalized"), None),
        ("mini-batches per epoch (rows)", f"{s.get('mini_batches_per_epoch')} {s.get('mini_batches')}", None),
        ("gradient accumulation GA (verl's)", s.get("ga") if s.get("ga") is not None else "dynamic", None),
        ("micro-batches run per mini-batch (rank 0)", s.get("micro_batches_run") or "dynamic", None),
        ("optimizer steps per training step", s.get("optimizer_steps_per_step"), None),
        ("log-prob micro-batches per rank", s.get("log_prob_micro_batches_per_rank"), None),
        ("loss scale per micro-batch", s.get("loss_scale"), None),
    ]
    if "tokens" in s:
        tok = s["tokens"]
        rows.append(("tokens total (padded width total)", f"{tok['total']:,} ({tok['padded_total']:,})", None))
        if "per_dp_rank_min" in tok:
            span_ = f"{tok['per_dp_rank_min']:,}–{tok['per_dp_rank_max']:,}"
            rows.append(("tokens per DP rank after balance", span_, None))
    for k, v in (s.get("global_seqlen") or {}).items():
        rows.append((k, f"{v:,.1f}" if isinstance(v, float) else f"{v:,}", None))
    if s.get("memory_not_priced"):
        rows.append(("bytes per rank", s["memory_not_priced"], None))
    for stage, err in (s.get("stage_errors") or {}).items():
        rows.append((f"verl stops at {stage}", f"{err['code']} {err['exc_type']}: {err['message']}", "error"))
    first = s.get("first_error")
    if first:
        rows.append(("validate", f"{first.get('code')} {first.get('exc_type')}: {first.get('message')}", "error"))
    elif s.get("validate_ok"):
        rows.append(("validate", "verl accepts this config", "ok"))
    return rows
