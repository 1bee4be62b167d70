"""``labkit explain [CODE] [--markdown]``: one entry of the error catalogue (labkit.rules.catalogue, docs/errors.md),
every code with its title, or the whole catalogue as Markdown."""

from __future__ import annotations

import argparse
import sys


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
