"""``labkit diagnose LOG|-``: read a failed verl run's log and answer it (``labkit.cli`` adds the sub-command with
``add_arguments`` and calls ``run``). Exit 0 diagnosed, 1 read but not explained, 2 unreadable. Its ``--profile`` is
stored as ``log_profile``: unset, the log's own frames pick the profile, which the CLI's release resolution (an
unset profile becomes engine) must not pre-empt."""

from __future__ import annotations

import argparse
import json
import os
import sys

from labkit.config.messages import ConfigError
from labkit.config.text_input import read_config_text
from labkit.diagnose.answer import diagnose_text
from labkit.diagnose.log_lines import MAX_LOG_BYTES, LogError

DOC = "read a failed verl run's log: the config, the phase, the failing tensor or collective, and the fix"


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("log", metavar="LOG|-", help="a verl log (what the driver printed, Ray's lines included), or -")
    s.add_argument("--model", default=None, help="the model to price (default: the one the config names)")
    s.add_argument(
        "--profile",
        dest="log_profile",
        choices=("legacy", "engine"),
        default=None,
        help="verl's workers (default: as the frames show; engine when they do not say)",
    )
    s.add_argument(
        "--config", default=None, metavar="SCRIPT", help="the launch script, when the log does not hold the config"
    )
    s.add_argument("--json", action="store_true", help='{"kind", "phase", "code", "overrides", "model", ...}')


def read_log(path: str) -> tuple[str, str]:
    """The log's text (its last ``MAX_LOG_BYTES`` when longer: the failure is near the end) and a note on what was
    left out; ConfigError when the file cannot be read."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - MAX_LOG_BYTES))
                data = fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    note = ""
    if len(data) > MAX_LOG_BYTES or (path != "-" and size > MAX_LOG_BYTES):
        total = len(data) if path == "-" else size
        data = data[-MAX_LOG_BYTES:]
        note = f"read the last {MAX_LOG_BYTES // 2**20} MiB of {total / 2**20:,.0f} MiB (the start, with the config, is left out)"
    return data.decode("utf-8", errors="replace").replace("\x00", ""), note


def run(ns: argparse.Namespace) -> int:
    text, note = read_log(ns.log)
    try:
        extra = read_config_text(open(ns.config).read()).overrides if ns.config else None
    except OSError as exc:
        raise ConfigError(f"--config {ns.config}: cannot read: {exc.strerror}") from None
    try:
        d = diagnose_text(text, model=ns.model, profile=ns.log_profile, overrides=extra)
    except LogError as exc:
        raise ConfigError(f"{ns.log}: {exc}") from None
    if note:
        d.lines.insert(3, note)  # after the opening memory, phase and config lines
    print(json.dumps(d.to_dict(), default=str) if ns.json else d.text())
    if d.exit_code == 2:
        print(f"labkit: {ns.log}: no failure and no config labkit reads in this log", file=sys.stderr)
    return d.exit_code
