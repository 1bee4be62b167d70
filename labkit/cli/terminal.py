"""The terminal ``labkit plan`` and ``labkit check`` print to: a rich console that fits the terminal, or 200 columns
when the output is piped."""

from __future__ import annotations

import sys

from rich.console import Console


def console(soft_wrap: bool = False) -> Console:
    """Tables fit the terminal (200 columns when piped); ``soft_wrap``: lines are never wrapped, so each of verl's
    messages stays whole on one line (greppable in a log)."""
    return Console(width=None if sys.stdout.isatty() else 200, highlight=False, soft_wrap=soft_wrap)
