"""``labkit plan``: what every rank holds at every stage of one training step (labkit.plan.step.plan), as rich tables
(per stage, per rank, a summary, the rollout engine on this machine) or as ``StepTrace.to_json()``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from labkit.cli.config_input import run_from_args
from labkit.cli.terminal import console
from labkit.config.messages import ConfigError
from labkit.memory import command as memory_command
from labkit.plan import tables
from labkit.trace import StepTrace


def _table(title: str | None, columns: Sequence[tuple[str, str]], show_header: bool = True) -> Table:
    t = Table(title=title, show_header=show_header)
    for col, just in columns:
        t.add_column(col, justify=just, overflow="fold")
    return t


def stage_table(tr: StepTrace) -> Table:
    """One row per stage: global count, per-rank rows, micro-batches per rank, tokens per rank, the rule."""
    t = _table(tables.stage_title(tr), tables.STAGE_COLUMNS)
    rows = tables.stage_rows(tr)
    stop = next((i for i, r in enumerate(rows) if r.stops), len(rows) - 1)
    for row in rows[: stop + 1]:  # nothing after the stage where verl stops is planned
        t.add_row(*(escape(str(v)) for v in row.cells), style="red" if row.stops else None)
    if stop < len(rows) - 1:
        after = ", ".join(r.cells[1] for r in rows[stop + 1 :])
        t.add_row("", "not run", "", "", "", "", escape(f"{after} (verl stops at {rows[stop].cells[1]})"), style="dim")
    return t


def rank_table(tr: StepTrace) -> Table:
    """Per-rank rows per stage, consecutive identical ranks grouped."""
    t = _table(tables.RANK_TITLE, tables.RANK_COLUMNS)
    for row in tables.rank_rows(tr):
        t.add_row(*(escape(str(v)) for v in row))
    return t


def summary_table(tr: StepTrace) -> Table:
    """The key numbers and the verdict."""
    t = _table("Summary", [("what", "left"), ("value", "left")], show_header=False)
    for what, value, mood in tables.summary_rows(tr):
        colour = {"error": "red", "ok": "green"}.get(mood)
        what = f"[bold {colour}]{escape(what)}[/]" if colour else f"[bold]{escape(what)}[/]"
        value = "—" if value is None else escape(str(value))
        t.add_row(what, f"[{colour}]{value}[/]" if mood == "ok" else value)
    return t


def cmd_plan(ns: argparse.Namespace) -> int:
    from labkit.plan.sessions import failed_from, order_from
    from labkit.plan.step import PlanTooLarge, plan

    step = ns.step or 1
    try:
        run = run_from_args(ns, step)
        geo = run.geometry
        sessions = ns.failed_sessions or ns.completion_order
        if sessions and geo.loop != "v1":
            raise ValueError("--failed-sessions and --completion-order apply to the v1 loop (trainer.use_v1=true)")
        if sessions and geo.too_large_to_plan():
            raise PlanTooLarge(geo.too_large_to_plan())
        failed = failed_from(ns.failed_sessions, geo.generated_samples, ns.seed) if sessions else []
        alive = sorted(set(range(geo.generated_samples)) - set(failed)) if ns.completion_order else []
        order = order_from(ns.completion_order, alive) if ns.completion_order else None
        tr = plan(
            run, ns.lengths, dispatch=ns.dispatch, seed=ns.seed, completion_order=order, global_step=step,
            failed_sessions=failed,
        )  # fmt: skip
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None
    model, whose = _plan_model(run, ns.model)
    memory_command.fill_trace(tr, run, model)
    engine = _engine_plan(run, model)
    tr.summary["rollout_engine"] = engine if isinstance(engine, str) else engine.as_dict()
    tr.summary["model"] = {"name": model, "why": whose}
    if ns.json:
        print(tr.to_json())
        return 0
    con = console()
    con.print(stage_table(tr))
    con.print(rank_table(tr))
    con.print(summary_table(tr))
    con.print(engine_table(engine, f"{model}, {whose}"))
    return 0


def _plan_model(cfg: Any, explicit: str | None) -> tuple[str, str]:
    """The model ``labkit plan`` sizes bytes and the engine for, and why: --model, the config's model.path, or
    labkit's tiny CPU model when the path names no shape labkit knows (said so)."""
    from labkit.memory.model_source import PATH_KEY, model_for

    if explicit:
        return model_for(cfg, explicit).name, "--model"
    if not cfg.is_set(PATH_KEY):  # the plan sizes labkit's own machine: its default config trains the tiny model
        return "tiny-qwen2", f"labkit's tiny CPU model: {PATH_KEY} is not set (--model)"
    try:
        return model_for(cfg).name, f"from {PATH_KEY}"
    except ConfigError:
        path = str(cfg.get(PATH_KEY) or "")[:80]
        return "tiny-qwen2", f"labkit's tiny CPU model: {PATH_KEY}={path!r} names no shape labkit knows (--model)"


def _engine_plan(cfg: Any, model: str) -> Any:
    """The rollout engine of ``cfg`` for ``model`` on this machine (labkit.plan.rollout_engine), or why not."""
    from labkit.memory.model_catalogue import model_shape
    from labkit.plan.rollout_engine import EngineModel, plan_engine
    from labkit.runtime.host import this_host

    m = model_shape(model)
    dims = EngineModel(
        m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads, m.hidden_size, m.head_dim,
        m.max_position_embeddings, m.param_count(),
    )  # fmt: skip
    try:
        return plan_engine(cfg, dims, this_host(cfg.n_gpus))
    except ValueError as exc:
        return str(exc)


def engine_table(engine: Any, model: str = "") -> Table:
    """Each rollout key of the engine and what it became on this machine (or why the engine cannot start), for
    ``model`` (named in the title: the rows are about that model)."""
    t = Table(title=f"Rollout engine on this machine ({escape(model)})" if model else "Rollout engine on this machine")
    t.add_column("rollout key", style="bold")
    t.add_column("value")
    t.add_column("became", overflow="fold")
    for key, value, became in [("engine", "", engine)] if isinstance(engine, str) else engine.rows():
        t.add_row(escape(key), escape(value), escape(became))
    return t
