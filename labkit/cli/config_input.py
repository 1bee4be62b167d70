"""The command line's input, read once per command: every option value validated where it is read
(``read_options``), a config file or launch script's text (``source_text``), and the one place a command's config
arguments (a YAML or script, Hydra overrides, ``--set``, ``--profile``, ``--verl``) become a config
(``config_from_args``). Errors are ``ConfigError`` (exit code 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from labkit.config import versions
from labkit.config.launch_script import MAX_SCRIPT_BYTES, LaunchError, login_environment, parse_sets
from labkit.config.lengths import parse_lengths
from labkit.config.messages import ConfigError
from labkit.config.text_input import YAML, is_yaml, load_script_config
from labkit.config.verl_config import VerlConfig, load_config, load_config_text
from labkit.config.yaml_input import YamlInputError
from labkit.config.yaml_input import read_config_text as read_config_file
from labkit.diagnose.log_lengths import PREFIX as LOG_LENGTHS
from labkit.diagnose.log_lengths import lengths_from_log
from labkit.rules.run import Run, as_run


def read_options(ns: argparse.Namespace) -> None:
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


def source_text(path: str) -> str:
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


def config_from_args(ns: argparse.Namespace) -> VerlConfig:
    """The config of a command's arguments, for the release ``--verl`` names (``labkit.config.versions``)."""
    try:
        cfg = versions.apply_release(_config(ns.args, ns.profile, ns.set, lenient=ns.cmd == "memory"), ns.release)
    except versions.VersionError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.hydra_stops and ns.cmd != "check":  # check prints them as verl's verdict; plan and memory go on without
        for stop in cfg.hydra_stops:
            print(f"labkit: note: {stop}; answered without it", file=sys.stderr)
    return cfg


def run_from_args(ns: argparse.Namespace, global_step: int | None = None) -> Run:
    """The command's config resolved once into its run (``labkit.rules.run``), at ``global_step`` (default the
    first): what every command hands down."""
    return as_run(config_from_args(ns), global_step)


def _config(args: Sequence[str], profile: str, sets: Sequence[str] = (), lenient: bool = False) -> VerlConfig:
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
    text = source_text(path)
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
