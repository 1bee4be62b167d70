"""``labkit read SCRIPT|- [args]``: the arguments a launch script passes to verl's entry point, read as bash reads it
(labkit.config.launch_script; the script is never run)."""

from __future__ import annotations

import argparse
import os
import sys

from labkit.cli.config_input import source_text
from labkit.config.launch_script import LaunchError, exact_args, login_environment, parse_sets, read_script
from labkit.config.messages import ConfigError


def cmd_read(ns: argparse.Namespace) -> int:
    """``labkit read SCRIPT|- [args]``: the arguments bash would pass to verl's entry point, one per line."""
    text = source_text(ns.script)
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
