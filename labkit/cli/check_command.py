"""``labkit check``: verl's verdict on a config (labkit.validate.report.check, then the first step planned): the exact
error, when, the arithmetic, the fixes, the notes of silent behaviour and the hangs the config can meet, one
message per line. Exit code 1 when verl would fail."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape

from labkit.cli.config_input import run_from_args
from labkit.cli.terminal import console
from labkit.rules.run import Run
from labkit.trace import StepTrace

HANG_DRAW_S = 1.0
"""How long ``check --lengths PROFILE`` draws length sets for the hang warnings (at least 8 are drawn)."""


def _label(run: Run) -> str:
    """ "engine profile, v1 loop": the profile and, for verl 0.9.1, which trainer loop (``trainer.use_v1``); with
    ``--verl``, the release and where it differs from what labkit models."""
    loop = run.loop
    label = f"{run.profile} profile" + (f", {loop} loop" if loop != "legacy" else "")
    if run.release is not None:
        label += f", as verl {run.release.version} runs it" + "".join(f"; {d}" for d in run.release.differences)
    return label


def _print_finding(con: Console, f: Any) -> None:
    g = (lambda k: f.get(k)) if isinstance(f, dict) else (lambda k: getattr(f, k, None))
    head = escape(str(g("exc_type")))
    con.print(f"[bold red]{head}[/bold red] ({escape(str(g('code')))}): {escape(str(g('message')))}")
    con.print(f"  when:  {g('when')}   where: {g('where')}", markup=False)
    for line in g("arithmetic") or []:
        con.print(f"  {line}", markup=False)
    if g("explanation"):
        con.print(f"  why:   {g('explanation')}", markup=False)
    for fix in g("fixes") or []:
        con.print(f"  fix:   {fix}", markup=False)
    _print_docs(con, g("code"))


def _print_docs(con: Console, code: Any) -> None:
    """The link to a code's section of docs/errors.md (codes without a catalogue entry get none)."""
    from labkit.rules.catalogue import catalogue

    if code in catalogue():
        con.print(f"  docs:  {catalogue()[code].anchor}", markup=False)


def cmd_check(ns: argparse.Namespace) -> int:
    run = run_from_args(ns)  # the config, resolved once: check, plan and the hang draws all take it
    from labkit.memory.model_source import check_shape
    from labkit.validate.report import check

    report = check(run, global_step=ns.step, **check_shape(run))
    con = console(soft_wrap=True)
    if run.config.hydra_stops:  # verl's config loader refuses before any of verl's checks: the verdict, then the rest
        con.print(
            f"verl rejects this config at start-up ({_label(run)}): its Hydra config loader stops on", markup=False
        )
        for stop in run.config.hydra_stops:
            con.print(f"  {stop}", markup=False)
        con.print("without those overrides, labkit's check says:")
        code = _check_body(con, run, ns, report)
        return max(code, 1)
    return _check_body(con, run, ns, report)


def _check_body(con: Console, run: Run, ns: argparse.Namespace, report: Any) -> int:
    """The verdict of verl's checks and the first step on ``run`` (``report``: labkit.validate.report.check's)."""
    from labkit.plan.step import PlanTooLarge, plan
    from labkit.rules.v1_loop import first_update_step

    first = report.first_error
    notes = [f for f in report.findings if f.severity != "error"]
    if first is not None:
        con.print(f"verl rejects this config ({_label(run)}):")
        _print_finding(con, first)
        for f in notes:
            if f.code in ("N6", "S5"):  # what the v1 loop does to the batch before the failing check
                _print_note(con, f)
        if first.code in ("X2", "E20"):  # a size normalised to 0: split(0) looped in early verl (hang (c))
            _print_hang_risks(con, run, ns, None)
        return 1
    try:
        planned = plan(run)
        errors, at = planned.summary.get("stage_errors") or {}, "the first step"
        warmup = first_update_step(run.get("trainer.critic_warmup"), ns.step)
        if not errors and warmup is not None:  # the first actor update
            errors = plan(run, global_step=warmup).summary.get("stage_errors") or {}
            at = f"step {warmup}, the first with an actor update (trainer.critic_warmup)"
    except PlanTooLarge as exc:
        con.print(
            f"[green]verl's start-up checks accept this config[/green] ({_label(run)}); the first step "
            f"is not checked: {escape(str(exc))}",
        )
        return 0
    if errors:
        con.print(f"verl accepts the config, then stops during {at} ({_label(run)}):")
        for stage, err in errors.items():
            con.print(f"  at {stage}: {err['exc_type']} ({err['code']}): {err['message']}", markup=False)
            _print_docs(con, err["code"])
        _print_hang_risks(con, run, ns, planned)
        return 1
    con.print(f"[green]verl accepts this config[/green] ({_label(run)}).")
    for f in notes:
        _print_note(con, f)
    _print_hang_risks(con, run, ns, planned)
    return 0


def _print_hang_risks(con: Console, run: Run, ns: argparse.Namespace, planned: StepTrace | None) -> None:
    """Warnings of the hangs (a)-(c) this config (with --lengths) can meet (labkit.plan.hang_risk)."""
    from labkit.plan.hang_risk import config_risks
    from labkit.plan.step import PlanTooLarge

    try:
        risks = config_risks(run, ns.lengths, seed=ns.seed, trace=planned, time_budget_s=HANG_DRAW_S)
    except PlanTooLarge:  # a step too large to plan per rank: no per-rank prediction
        return
    for risk in risks:
        con.print(f"  warning: {risk.line()}", markup=False)


def _print_note(con: Console, f: Any) -> None:
    """A silent behaviour or notice: verl's printed text if any, else labkit's explanation and arithmetic."""
    con.print(f"  note ({f.severity}): {f.code} {f.message or f.explanation}", markup=False)
    if not f.message:
        for line in f.arithmetic:
            con.print(f"    {line}", markup=False)
    _print_docs(con, f.code)
