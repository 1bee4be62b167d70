"""A config pasted as text: a verl YAML document, or a command line of Hydra overrides as verl's example scripts
write them (``python3 -m verl.trainer.main_ppo \\`` then ``key=value`` lines).

``read_config_text(text)`` decides which of the two the text is and returns the overrides it carries (or the YAML),
plus the tokens it did not read (the program, Hydra's ``--config-path``/``--config-name``, ``$@``, a trailing
``2>&1 | tee log``), so a caller can say what was skipped. ``load_pasted_config`` builds the ``VerlConfig``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from labkit.config.verl_config import ConfigError, VerlConfig, load_config, load_config_text

YAML, OVERRIDES = "yaml", "overrides"
_YAML_START = re.compile(r"^(---|%YAML|\{|[A-Za-z_][\w.-]*\s*:(\s|$))")
_OVERRIDE = re.compile(r"^(\+{0,2}[A-Za-z_][\w-]*(\.[\w-]+)*=|~[A-Za-z_][\w.-]*$|~[A-Za-z_][\w.-]*=)")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")  # VAR=value before the program: the shell's, not Hydra's
_HYDRA_FLAGS = ("--config-path", "--config-name", "--config-dir", "-cp", "-cn", "-cd", "--multirun", "-m")
_SHELL_STOP = ("|", "||", "&&", ";", "&")


@dataclass
class ConfigText:
    """What a pasted text holds: ``kind`` ``yaml`` (``yaml_text``) or ``overrides`` (``overrides``), and the tokens
    of a command line that are not overrides (``skipped``)."""

    kind: str
    overrides: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    yaml_text: str = ""

    def describe(self) -> str:
        """One line: how the text was read."""
        if self.kind == YAML:
            return "read as a verl YAML document"
        head = f"read as a command line of {len(self.overrides)} override(s)"
        return head + (f"; not read: {' '.join(self.skipped)}" if self.skipped else "")


def _first_line(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped
    return ""


def is_yaml(text: str) -> bool:
    """True when the first line that is not blank or a comment opens a YAML mapping (``key:``, ``---``, ``{``)."""
    return bool(_YAML_START.match(_first_line(text)))


def _is_hydra_flag(token: str) -> bool:
    return token.split("=", 1)[0] in _HYDRA_FLAGS


def split_command_line(text: str) -> tuple[list[str], list[str]]:
    """The Hydra overrides of a shell command line and the tokens skipped. Backslash line continuations, quotes
    and ``#`` comments are read as a shell reads them; env assignments and the program before the first override,
    Hydra's own flags, ``$@`` and everything from a pipe or redirection on are skipped. A stray word after the
    overrides is kept, so ``VerlConfig.override`` reports it (not of the form key=value)."""
    try:  # a backslash at the end of a line continues it (shlex would keep the newline as a token)
        tokens = shlex.split(re.sub(r"\\\r?\n", " ", text), comments=True, posix=True)
    except ValueError as exc:  # an unclosed quote
        raise ConfigError(f"cannot read the command line: {exc}.") from None
    overrides: list[str] = []
    skipped: list[str] = []
    started = False
    for i, tok in enumerate(tokens):
        if tok in _SHELL_STOP or re.match(r"^\d*>", tok):
            skipped.append(" ".join(tokens[i:]))
            break
        if tok in ("$@", "$*", "${@}") or _is_hydra_flag(tok):
            skipped.append(tok)
        elif _OVERRIDE.match(tok) and (started or "." in tok.split("=", 1)[0] or tok.startswith(("~", "+"))):
            started = True
            overrides.append(tok)
        elif not started and (_ENV.match(tok) or not tok.startswith(("~", "+"))):
            skipped.append(tok)  # VAR=1, the program, -m, the module, --nproc_per_node=8 ...
        else:
            overrides.append(tok)
    return overrides, skipped


def read_config_text(text: str) -> ConfigText:
    """Which kind of config ``text`` is, and what it holds (ConfigError for an unreadable command line)."""
    text = text.replace("\r\n", "\n")
    if is_yaml(text):
        return ConfigText(YAML, yaml_text=text)
    overrides, skipped = split_command_line(text)
    return ConfigText(OVERRIDES, overrides=overrides, skipped=skipped)


def load_pasted_config(text: str, profile: str = "engine", extra: Iterable[str] = ()) -> tuple[VerlConfig, ConfigText]:
    """The config a pasted YAML or command line describes, for ``profile``, with ``extra`` overrides applied last
    (e.g. the loop a dashboard picks); ConfigError as ``load_config`` raises it."""
    read = read_config_text(text)
    if read.kind == YAML:
        return load_config_text(read.yaml_text, extra, profile=profile), read
    return load_config(None, [*read.overrides, *extra], profile=profile), read
