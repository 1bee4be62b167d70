"""The ``labkit`` script's entry point: the argument parser of every sub-command (``parser``) and ``main``, which
reads the options once (labkit.cli.config_input) and runs the command (exit codes: labkit.cli)."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from labkit.cli.check_command import cmd_check
from labkit.cli.config_input import read_options, run_from_args
from labkit.cli.explain_command import cmd_explain
from labkit.cli.plan_command import cmd_plan
from labkit.cli.read_command import cmd_read
from labkit.config.lengths import LengthsError
from labkit.config.messages import ConfigError, clip
from labkit.diagnose import command as diagnose_command
from labkit.memory import command as memory_command

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
        read_options(ns)
        if ns.cmd == "explain":
            return cmd_explain(ns)
        if ns.cmd == "read":
            return cmd_read(ns)
        if ns.cmd == "diagnose":
            return diagnose_command.run(ns)
        if ns.cmd == "memory" and getattr(ns, "trace", None) is not None:
            from labkit.model.trace_runner import TraceProcess

            with TraceProcess() as child:  # it imports torch and transformers while the config is read
                return memory_command.run(run_from_args(ns), ns, child.run_one)
        if ns.cmd == "memory":
            return memory_command.run(run_from_args(ns), ns)
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
