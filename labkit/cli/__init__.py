"""Command line layer: the ``labkit`` script. ``labkit plan`` (the pipeline at a glance, per stage and per rank),
``labkit check`` (verl's verdict on a config), ``labkit read SCRIPT`` (what a launch script passes to verl) and
``labkit explain CODE`` (one entry of the error catalogue, docs/errors.md); ``labkit memory`` and ``labkit diagnose``
live in labkit.memory.command and labkit.diagnose.command and are registered here. Pure arithmetic, no processes.
Run as ``labkit ...`` or ``python -m labkit.cli ...``.

Modules: ``entry_point`` (the parser and ``main``), ``config_input`` (the command line's options and config
arguments read once: ``config_from_args``), one per command (``plan_command`` with its tables, ``check_command`` with
its printing, ``read_command``, ``explain_command``) and ``terminal`` (the rich console plan and check print to).

Exit codes: 0 fine, 1 verl would fail on this config (``check``), 2 labkit cannot read the input (unknown key,
wrong type, malformed or oversized YAML, bad --lengths), 3 an internal error of labkit (one line; ``--debug`` shows
the traceback).

May import: every layer below it (trainer, hangs, rl, model, runtime, protocol, diagnose, memory, plan, validate,
balance, rules, config, trace), not ``labkit.ui`` (its sibling layer); within labkit only ``labkit.reality`` imports
it (it runs ``main`` in process).
"""

from labkit.cli.entry_point import main

__all__ = ["main"]
