"""Command line: ``labkit plan`` (the pipeline at a glance, per stage and per rank), ``labkit check`` (verl's
verdict on a config), ``labkit read SCRIPT`` (what a launch script passes to verl) and ``labkit explain CODE`` (one entry of the error catalogue, docs/errors.md). Pure arithmetic,
no processes. Run as ``labkit ...`` or ``python -m labkit.cli ...``.

Exit codes: 0 fine, 1 verl would fail on this config (``check``), 2 labkit cannot read the input (unknown key,
wrong type, malformed or oversized YAML, bad --lengths), 3 an internal error of labkit (one line; ``--debug`` shows
the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from labkit.config import versions
from labkit.config.launch_script import (
    MAX_SCRIPT_BYTES,
    LaunchError,
    exact_args,
    login_environment,
    parse_sets,
    read_script,
)
from labkit.config.lengths import LengthsError, parse_lengths
from labkit.config.messages import clip
from labkit.config.text_input import YAML, is_yaml, load_script_config
from labkit.config.verl_config import ConfigError, load_config, load_config_text
from labkit.config.yaml_input import YamlInputError
from labkit.config.yaml_input import read_config_text as read_config_file
from labkit.diagnose import command as diagnose_command
from labkit.diagnose.log_lengths import PREFIX as LOG_LENGTHS
from labkit.diagnose.log_lengths import lengths_from_log
from labkit.memory import command as memory_command
from labkit.plan import tables
from labkit.trace import StepTrace

SET_HELP = "a shell variable's value for the script (the environment, or what $(...) printed); repeatable"
VERL_HELP = (
    "the verl release you run (0.1, 0.2, 0.3, 0.4 as forks vendor them; 0.5, 0.6, 0.7, 0.8, 0.9.0, 0.9.1): picks the "
    "profile and loop it runs, and the old releases' own defaults and memory behaviour"
)


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (its usage block stays behind --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {clip(message)} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="labkit", description="verl Batch Lab: plan and check verl batch configs.")
    p.add_argument("--debug", action="store_true", help="show the traceback of an internal error (exit code 3)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, doc in (
        ("plan", "what every rank holds at every stage of one training step"),
        ("check", "verl's verdict on a config: exact error, when, the arithmetic, the fixes"),
        ("memory", memory_command.DOC),
    ):
        s = sub.add_parser(name, help=doc, description=doc)
        s.add_argument(
            "args",
            nargs="*",
            metavar="[CONFIG.yaml|SCRIPT.sh|-] [key=value ...]",
            help="optional verl-style YAML or launch script (read as bash reads it), then Hydra overrides "
            "(key=value, +key=value, ++key=value, ~key)",
        )
        s.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help=SET_HELP)
        s.add_argument(
            "--profile",
            choices=("legacy", "engine"),
            default=None,
            help="legacy: verl <= 0.7 workers (fsdp_workers.py); engine: verl 0.9.1's engine workers (default)",
        )
        s.add_argument("--verl", metavar="VERSION", help=VERL_HELP)
        s.add_argument(
            "--lengths",
            default=None,
            help="a length profile (seed-8, gsm8k-like, long-reasoning, full-width), L1,L2,..., prompt=P,response=R "
            "(every sample that long) or log:PATH (the means of a verl log's last step)"
            + (
                "; check: also warns of hangs these lengths trigger (a profile: with their probability)"
                if name == "check"
                else ""
            ),
        )
        if name in ("check", "plan"):
            s.add_argument(
                "--step",
                type=int,
                default=None,
                metavar="N",
                help="verl's global step (1 = the first; the actor updates from trainer.critic_warmup on): plan that "
                "step; check steps 1..N (default: every step)",
            )
        if name == "check":
            s.add_argument("--seed", type=int, default=0, help="first seed of the drawn length profiles")
        if name == "memory":
            memory_command.add_arguments(s)
        if name == "plan":
            s.add_argument("--json", action="store_true", help="print StepTrace.to_json() instead of tables")
            s.add_argument(
                "--dispatch",
                choices=("mesh", "all_gather"),
                default=None,
                help="mesh: nd dispatch (v0.6+); all_gather: <=v0.5 DP_COMPUTE_PROTO + TP/SP all-gather",
            )
            s.add_argument("--seed", type=int, default=0, help="seed for drawn length profiles")
            s.add_argument(
                "--failed-sessions",
                default=None,
                metavar="I,J,..|rate=R",
                help="v1: agent-loop sessions that failed (trajectory indices p·n + session, or a rate drawn with "
                "--seed); the replay buffer keeps their groups' survivors",
            )
            s.add_argument(
                "--completion-order",
                default=None,
                metavar="submission|random:SEED|I,J,..",
                help="v1: the order the surviving sessions finished in (default: submission order)",
            )
            s.add_argument(
                "--model",
                default=None,
                help="model shape for bytes_predicted and the rollout engine (default: the one "
                "actor_rollout_ref.model.path names, else labkit's tiny CPU model, said so)",
            )
    doc = "the arguments a launch script passes to verl's entry point, read as bash reads it (never run)"
    s = sub.add_parser("read", help=doc, description=doc)
    s.add_argument("script", metavar="SCRIPT|-", help="a launch script, or - for standard input")
    s.add_argument("args", nargs="*", help="arguments given after the script (its $@; after -- if one starts with -)")
    s.add_argument("--set", action="append", metavar="NAME=VALUE", help=SET_HELP)
    s = sub.add_parser("diagnose", help=diagnose_command.DOC, description=diagnose_command.DOC)
    diagnose_command.add_arguments(s)
    doc = "what an error code means: verl's message, exception, where, versions, when, why"
    s = sub.add_parser("explain", help=doc, description=doc)
    s.add_argument("code", nargs="?", help="a code such as E21 (any case); none: list every code")
    s.add_argument("--markdown", action="store_true", help="print the whole catalogue as docs/errors.md")
    return p


def _read_options(ns: argparse.Namespace) -> None:
    """Every option value validated once, where it is read, the same way for every command: --lengths (a profile
    or positive integers), --seed (0 to 2**32 - 1); an option given as ``--opt=--`` (argparse's empty list) has
    no value."""
    for name in ("gpu", "gpu_memory", "model", "lengths", "seed", "margin", "head", "trace", "dispatch", "config"):
        if isinstance(getattr(ns, name, None), list):
            raise ConfigError(f"--{name.replace('_', '-')} needs a value")
    if isinstance(getattr(ns, "lengths", None), str) and ns.lengths.startswith(LOG_LENGTHS):
        ns.lengths = lengths_from_log(ns.lengths)  # the lengths a run met, from its log's metrics
    if getattr(ns, "lengths", None) is not None:
        ns.lengths = parse_lengths(ns.lengths)
    if hasattr(ns, "profile"):
        try:
            ns.profile, ns.release = versions.resolve(ns.profile, ns.verl)
        except versions.VersionError as exc:
            raise ConfigError(str(exc)) from None
        if hasattr(ns, "dispatch") and ns.dispatch is None:
            ns.dispatch = ns.release.dispatch if ns.release else "mesh"
    step = getattr(ns, "step", None)
    if step is not None and not 1 <= step <= 10**9:
        raise ConfigError(f"--step must be a global step from 1 (verl's first) to 10**9, got {step}")
    seed = getattr(ns, "seed", 0)
    if not 0 <= seed < 2**32:
        raise ConfigError(f"--seed must be a non-negative integer, got {seed} (at most 2**32 - 1)")


def _source_text(path: str) -> str:
    """The text of a config or script file, or of standard input for ``-`` (bounded, UTF-8)."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_SCRIPT_BYTES + 1)
        if len(data) > MAX_SCRIPT_BYTES:
            raise ConfigError(f"-: labkit reads launch scripts of at most {MAX_SCRIPT_BYTES:,} bytes.")
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"-: not UTF-8 text (byte {exc.start})") from None
    if not Path(path).exists():
        raise ConfigError(f"{path}: no such config file or script (overrides are key=value).")
    try:
        return read_config_file(path)
    except YamlInputError as exc:
        raise ConfigError(f"{path}: {exc}.") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def _ns_config(ns: argparse.Namespace):
    """The config of a command's arguments, for the release ``--verl`` names (``labkit.config.versions``)."""
    try:
        cfg = versions.apply_release(_config(ns.args, ns.profile, ns.set, lenient=ns.cmd == "memory"), ns.release)
    except versions.VersionError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.hydra_stops and ns.cmd != "check":  # check prints them as verl's verdict; plan and memory go on without
        for stop in cfg.hydra_stops:
            print(f"labkit: note: {stop}; answered without it", file=sys.stderr)
    return cfg


def _config(args: Sequence[str], profile: str, sets: Sequence[str] = (), lenient: bool = False):
    """Positional args: an optional YAML or launch script (``-``: standard input), then overrides (for a script:
    its ``$@``); ConfigError on bad input. A script is read as bash reads it (labkit.config.launch_script);
    ``lenient`` (memory): keys and base YAMLs verl does not have are set aside and named, not refused."""
    path, overrides = None, list(args)
    if overrides and "=" not in overrides[0] and not overrides[0].startswith(("~", "+")):
        path = overrides.pop(0)
    if path is None:
        return load_config(None, overrides, profile=profile, lenient=lenient)
    if not Path(path).exists() and path != "-":
        raise ConfigError(f"{path}: no such config file or script (overrides are key=value).")
    if path.endswith((".yaml", ".yml", ".json")):
        return load_config(path, overrides, profile=profile, lenient=lenient)
    text = _source_text(path)
    if is_yaml(text):
        return load_config_text(text, overrides, profile=profile, origin=path, lenient=lenient)
    try:
        cfg, read = load_script_config(
            text,
            overrides,
            profile=profile,
            sets=parse_sets(sets),
            login=login_environment(os.environ),
            lenient=lenient,
        )
    except LaunchError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if read.kind != YAML:
        print(f"labkit: {path}: {read.describe()}", file=sys.stderr)
    return cfg


def cmd_read(ns: argparse.Namespace) -> int:
    """``labkit read SCRIPT|- [args]``: the arguments bash would pass to verl's entry point, one per line."""
    text = _source_text(ns.script)
    try:
        read = read_script(text, extra=ns.args, sets=parse_sets(ns.set or ()), login=login_environment(os.environ))
        args = exact_args(read)
    except LaunchError as exc:
        raise ConfigError(f"{ns.script}: {exc}") from None
    for arg in args:
        print(arg)
    if read.assumed or read.from_caller:
        print(f"labkit: {read.assumed_line()}", file=sys.stderr)
    return 0


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


def _label(cfg: Any) -> str:
    """ "engine profile, v1 loop": the profile and, for verl 0.9.1, which trainer loop (``trainer.use_v1``); with
    ``--verl``, the release and where it differs from what labkit models."""
    from labkit.rules.geometry import BatchGeometry

    loop = BatchGeometry.from_config(cfg).loop
    label = f"{cfg.profile} profile" + (f", {loop} loop" if loop != "legacy" else "")
    if cfg.release is not None:
        label += f", as verl {cfg.release.version} runs it" + "".join(f"; {d}" for d in cfg.release.differences)
    return label


def _console(soft_wrap: bool = False) -> Console:
    """Tables fit the terminal (200 columns when piped); ``soft_wrap``: lines are never wrapped, so each of verl's
    messages stays whole on one line (greppable in a log)."""
    return Console(width=None if sys.stdout.isatty() else 200, highlight=False, soft_wrap=soft_wrap)


def cmd_plan(ns: argparse.Namespace) -> int:
    from labkit.plan.sessions import failed_from, order_from
    from labkit.plan.step import PlanTooLarge, plan
    from labkit.rules.geometry import BatchGeometry

    cfg = _ns_config(ns)
    step = ns.step or 1
    try:
        geo = BatchGeometry.from_config(cfg, step)
        sessions = ns.failed_sessions or ns.completion_order
        if sessions and geo.loop != "v1":
            raise ValueError("--failed-sessions and --completion-order apply to the v1 loop (trainer.use_v1=true)")
        if sessions and geo.too_large_to_plan():
            raise PlanTooLarge(geo.too_large_to_plan())
        failed = failed_from(ns.failed_sessions, geo.generated_samples, ns.seed) if sessions else []
        alive = sorted(set(range(geo.generated_samples)) - set(failed)) if ns.completion_order else []
        order = order_from(ns.completion_order, alive) if ns.completion_order else None
        tr = plan(
            cfg, ns.lengths, dispatch=ns.dispatch, seed=ns.seed, completion_order=order, global_step=step,
            failed_sessions=failed,
        )  # fmt: skip
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None
    model, whose = _plan_model(cfg, ns.model)
    memory_command.fill_trace(tr, cfg, model)
    engine = _engine_plan(cfg, model)
    tr.summary["rollout_engine"] = engine if isinstance(engine, str) else engine.as_dict()
    tr.summary["model"] = {"name": model, "why": whose}
    if ns.json:
        print(tr.to_json())
        return 0
    con = _console()
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
    from labkit.memory.shapes import model_shape
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
    cfg = _ns_config(ns)
    from labkit.memory.model_source import check_shape
    from labkit.validate.report import check

    report = check(cfg, global_step=ns.step, **check_shape(cfg))
    con = _console(soft_wrap=True)
    if cfg.hydra_stops:  # verl's config loader refuses before any of verl's checks: the verdict, then the rest
        con.print(
            f"verl rejects this config at start-up ({_label(cfg)}): its Hydra config loader stops on", markup=False
        )
        for stop in cfg.hydra_stops:
            con.print(f"  {stop}", markup=False)
        con.print("without those overrides, labkit's check says:")
        code = _check_body(con, cfg, ns, report)
        return max(code, 1)
    return _check_body(con, cfg, ns, report)


def _check_body(con: Console, cfg: Any, ns: argparse.Namespace, report: Any) -> int:
    """The verdict of verl's checks and the first step on ``cfg`` (``report``: labkit.validate.report.check's)."""
    from labkit.plan.step import PlanTooLarge, plan
    from labkit.rules.v1_loop import first_update_step

    first = report.first_error
    notes = [f for f in report.findings if f.severity != "error"]
    if first is not None:
        con.print(f"verl rejects this config ({_label(cfg)}):")
        _print_finding(con, first)
        for f in notes:
            if f.code in ("N6", "S5"):  # what the v1 loop does to the batch before the failing check
                _print_note(con, f)
        if first.code in ("X2", "E20"):  # a size normalised to 0: split(0) looped in early verl (hang (c))
            _print_hang_risks(con, cfg, ns, None)
        return 1
    try:
        planned = plan(cfg)
        errors, at = planned.summary.get("stage_errors") or {}, "the first step"
        warmup = first_update_step(cfg.get("trainer.critic_warmup"), ns.step)
        if not errors and warmup is not None:  # the first actor update
            errors = plan(cfg, global_step=warmup).summary.get("stage_errors") or {}
            at = f"step {warmup}, the first with an actor update (trainer.critic_warmup)"
    except PlanTooLarge as exc:
        con.print(
            f"[green]verl's start-up checks accept this config[/green] ({_label(cfg)}); the first step "
            f"is not checked: {escape(str(exc))}",
        )
        return 0
    if errors:
        con.print(f"verl accepts the config, then stops during {at} ({_label(cfg)}):")
        for stage, err in errors.items():
            con.print(f"  at {stage}: {err['exc_type']} ({err['code']}): {err['message']}", markup=False)
            _print_docs(con, err["code"])
        _print_hang_risks(con, cfg, ns, planned)
        return 1
    con.print(f"[green]verl accepts this config[/green] ({_label(cfg)}).")
    for f in notes:
        _print_note(con, f)
    _print_hang_risks(con, cfg, ns, planned)
    return 0


HANG_DRAW_S = 1.0
"""How long ``check --lengths PROFILE`` draws length sets for the hang warnings (at least 8 are drawn)."""


def _print_hang_risks(con: Console, cfg: Any, ns: argparse.Namespace, planned: StepTrace | None) -> None:
    """Warnings of the hangs (a)-(c) this config (with --lengths) can meet (labkit.plan.hang_risk)."""
    from labkit.plan.hang_risk import config_risks
    from labkit.plan.step import PlanTooLarge

    try:
        risks = config_risks(cfg, ns.lengths, seed=ns.seed, trace=planned, time_budget_s=HANG_DRAW_S)
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


def cmd_explain(ns: argparse.Namespace) -> int:
    """Print one catalogue entry (plain text), every code with its title, or the whole catalogue as Markdown."""
    from labkit.rules.catalogue import catalogue, render_markdown, render_text

    if ns.markdown:
        print(render_markdown(), end="")
        return 0
    if ns.code is None:
        for e in catalogue().values():
            print(f"{e.code:<4} {e.title}")
        return 0
    code = ns.code.strip().upper()
    if code not in catalogue():
        print(f"labkit: unknown code {ns.code!r}; known: {', '.join(catalogue())}", file=sys.stderr)
        return 2
    print(render_text(code))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``labkit`` script; returns the exit code (0, 1, 2, or 3 for an internal error)."""
    parser = _parser()
    try:
        ns, rest = parser.parse_known_args(argv)
    except SystemExit as exc:  # argparse's one-line error (or --help): its exit code, for in-process callers too
        return exc.code if isinstance(exc.code, int) else 0
    if rest and (not hasattr(ns, "args") or any(r.startswith("-") for r in rest)):
        try:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        except SystemExit as exc:
            return int(exc.code or 2)
    if rest:
        ns.args = [*ns.args, *rest]  # overrides after an option (--set X=1 key=value)
    try:
        _read_options(ns)
        if ns.cmd == "explain":
            return cmd_explain(ns)
        if ns.cmd == "read":
            return cmd_read(ns)
        if ns.cmd == "diagnose":
            return diagnose_command.run(ns)
        if ns.cmd == "memory" and getattr(ns, "trace", None) is not None:
            from labkit.model.trace_runner import TraceProcess

            with TraceProcess() as child:  # it imports torch and transformers while the config is read
                return memory_command.run(_ns_config(ns), ns, child.run_one)
        if ns.cmd == "memory":
            return memory_command.run(_ns_config(ns), ns)
        return cmd_plan(ns) if ns.cmd == "plan" else cmd_check(ns)
    except (ConfigError, LengthsError) as exc:
        print(f"labkit: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a labkit bug: one line, the traceback only on request
        if ns.debug:
            traceback.print_exc()
            return 3
        print(
            f"labkit: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
