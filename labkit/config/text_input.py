"""A config given as text: a verl YAML document, or a launch script / command line read as bash reads it
(``labkit.config.launch_script``), the one reader of ``labkit check|plan|memory`` and of the dashboard.

``read_config_text`` decides which of the two the text is and returns the Hydra overrides it passes to verl, the
arguments it could not read (a value only known at run time, on a key labkit does not model) and what was skipped
(the launcher, Hydra's own flags); ``load_pasted_config`` builds the ``VerlConfig``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from labkit.config.bash_expand import MARK
from labkit.config.hydra_overrides import HydraError, check_base, split_hydra_args
from labkit.config.keys import KEYS
from labkit.config.launch_script import LaunchError, ScriptRead, read_script
from labkit.config.messages import ConfigError
from labkit.config.verl_config import VerlConfig, load_config, load_config_text

YAML, OVERRIDES = "yaml", "overrides"
_YAML_START = re.compile(r"^(---|%YAML|\{|[A-Za-z_][\w.-]*\s*:(\s|$))")
NOTHING_READ = "no verl overrides found in this text"


@dataclass
class ConfigText:
    """What a text holds: ``kind`` ``yaml`` (``yaml_text``) or ``overrides``: the overrides read exactly, the
    arguments not read (``not_read``: (argument with ``…`` for the unknown part, why)), what was skipped (the
    launcher, Hydra's flags) and the script's reading (``script``)."""

    kind: str
    overrides: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    yaml_text: str = ""
    not_read: list[tuple[str, str]] = field(default_factory=list)
    script: ScriptRead | None = None
    set_aside: list[str] = field(default_factory=list)
    """A lenient read's notes: the base YAML or entry point it read past (``check_base``)."""

    def modelled(self) -> list[str]:
        """The overrides read whose key labkit models (what its verdict depends on)."""
        return [o for o in self.overrides if o.split("=", 1)[0].lstrip("+~") in KEYS]

    def head(self) -> str:
        """How the text was read, in a few words."""
        if self.kind == YAML:
            return "read as a verl YAML document"
        head = f"read {len(self.overrides)} verl override(s)"
        if self.script is not None and self.script.module:
            head += f" at line {self.script.line} ({self.script.module})"
        return head + (f", {len(self.not_read)} argument(s) not read" if self.not_read else "")

    def describe(self) -> str:
        """One line: how the text was read, what was not, what was assumed."""
        parts = [self.head()]
        if self.not_read:
            parts.append("not read: " + "; ".join(f"{arg} ({why})" for arg, why in self.not_read))
        if self.script is not None and (self.script.assumed or self.script.from_caller):
            parts.append(self.script.assumed_line())
        return "; ".join(parts)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped
    return ""


def is_yaml(text: str) -> bool:
    """True when the first line that is not blank or a comment opens a YAML mapping (``key:``, ``---``, ``{``)."""
    return bool(_YAML_START.match(_first_line(text)))


def _path_like(key: str) -> bool:
    return key.endswith(("path", "_dir", "files"))


def script_overrides(read: ScriptRead, extra: Iterable[str] = (), lenient: bool = False) -> ConfigText:
    """The overrides of a script's launch (ConfigError for a base labkit does not model, or an unknown value on a
    key labkit models). An unknown value on a key labkit does not model is listed in ``not_read``; on a path key
    whose unknown part is only the directory (``$HOME/models/Qwen2.5-7B``) it is read as ``…/models/Qwen2.5-7B``."""
    out = ConfigText(OVERRIDES, script=read)
    args: list[str] = []
    blocking: list[str] = []
    for a in read.args:
        if a.unknown is None:
            args.append(a.text)
            continue
        key, eq, value = a.text.partition("=")
        path = key.lstrip("+~")
        if not eq or MARK in key or a.text.startswith("-"):
            blocking.append(f"{a.unknown}; it decides the argument '{a.shown()}'")
            out.not_read.append((a.shown(), a.unknown))
            continue
        if path in KEYS and not (_path_like(path) and "/" in value and MARK not in value.rsplit("/", 1)[1]):
            blocking.append(f"{a.unknown}; it decides '{a.shown()}', a key labkit models")
        out.not_read.append((a.shown(), a.unknown))
        if path in KEYS:
            args.append(a.shown())
    extra = list(extra)
    passed = read.args[-len(extra) :] if extra else []
    if extra and [a.text for a in passed] != extra:
        args.extend(extra)  # the script does not pass "$@": the user's overrides are applied after its own
    try:
        hydra = split_hydra_args(args)
        out.set_aside = check_base(hydra, read.module, lenient)
    except HydraError as exc:
        raise ConfigError(f"line {read.line}: {exc}") from None
    if out.set_aside and hydra.config_name:  # the recipe's base YAML is set aside: price over ppo_trainer's
        hydra = type(hydra)(hydra.overrides, None, None, hydra.hydra)
    out.overrides = [*hydra.base_overrides(), *hydra.overrides]
    out.skipped = [*read.launcher, *([f"-m {read.module}"] if read.module else [])]
    if hydra.config_name or hydra.config_path:
        out.skipped.append(f"--config-name={hydra.base()}")
    out.skipped.extend(hydra.hydra)
    if blocking:
        more = f" ({len(blocking) - 1} more such argument(s))" if len(blocking) > 1 else ""
        raise _with_read(ConfigError(blocking[0] + more), out)
    return out


def _with_read(exc: ConfigError, read: ConfigText) -> ConfigError:
    """``exc`` carrying what was read (``exc.read``), so a caller can list it beside the error."""
    exc.read = read
    return exc


def read_config_text(
    text: str,
    extra: Iterable[str] = (),
    sets: Mapping[str, str] | None = None,
    login: Mapping[str, str] | None = None,
    lenient: bool = False,
) -> ConfigText:
    """Which kind of config ``text`` is, and what it holds; ``extra``: arguments given after a script (its
    ``$@``), ``sets``: ``--set NAME=VALUE``. ConfigError for a text labkit cannot read."""
    text = text.replace("\r\n", "\n")
    if is_yaml(text):
        return ConfigText(YAML, yaml_text=text)
    try:
        read = read_script(text, extra=extra, sets=sets, login=login)
    except LaunchError as exc:
        lead = f"{NOTHING_READ}: " if str(exc).startswith("no verl launch") else ""
        raise ConfigError(f"{lead}{exc}") from None
    return script_overrides(read, extra, lenient)


def load_pasted_config(
    text: str,
    profile: str = "engine",
    extra: Iterable[str] = (),
    sets: Mapping[str, str] | None = None,
    login: Mapping[str, str] | None = None,
) -> tuple[VerlConfig, ConfigText]:
    """The config a YAML or a launch script describes, for ``profile``, with ``extra`` overrides applied last
    (e.g. the loop a dashboard picks); ConfigError as ``load_config`` raises it, and when the text holds no
    override at all (verl's defaults are not judged for a text labkit did not understand)."""
    read = read_config_text(text, sets=sets, login=login)
    if read.kind == YAML:
        return load_config_text(read.yaml_text, extra, profile=profile), read
    if not read.overrides and not read.not_read:
        raise _with_read(ConfigError(f"{NOTHING_READ} ({read.describe()})"), read)
    return load_config(None, [*read.overrides, *extra], profile=profile), read


def load_script_config(
    text: str,
    extra: Iterable[str] = (),
    profile: str = "engine",
    sets: Mapping[str, str] | None = None,
    login: Mapping[str, str] | None = None,
    lenient: bool = False,
) -> tuple[VerlConfig, ConfigText]:
    """``labkit check|plan|memory SCRIPT [overrides]``: ``extra`` are the script's ``$@`` (applied after its own
    overrides when it does not pass them on); ``lenient``: what verl's schema lacks is set aside, not refused."""
    read = read_config_text(text, extra=extra, sets=sets, login=login, lenient=lenient)
    if read.kind == YAML:
        return load_config_text(read.yaml_text, extra, profile=profile, lenient=lenient), read
    cfg = load_config(None, read.overrides, profile=profile, lenient=lenient)
    for note in read.set_aside:
        cfg.unknown[note.split(":", 1)[0]] = note.split(":", 1)[1].strip()
    return cfg, read
