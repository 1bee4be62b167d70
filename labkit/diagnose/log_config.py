"""The config a verl log carries, recovered as Hydra overrides: Hydra's ``Error executing job with overrides: [...]``,
the launch command line (read by labkit's bash reader), or verl's startup dump of the resolved config (a
pretty-printed dict). Which profile the log's workers are (``fsdp_workers.py``: legacy; ``engine_workers.py``:
engine) when its frames say."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from labkit.config.messages import ConfigError
from labkit.config.text_input import read_config_text
from labkit.config.verl_config import VerlConfig
from labkit.diagnose.log_lines import LogLine

HYDRA = re.compile(r"Error executing job with overrides: (\[.*)$")
COMMAND = re.compile(
    r"(?:^|[\s;&|])((?:\w+=\S+ )*(?:python3?|torchrun|uv run|ray job submit)\b.*?\bmain_\w+(?:\.py)?\b.*)$"
)
DUMP_START = re.compile(r"^\{'(?:actor_rollout_ref|algorithm|data|trainer|critic|reward_model)'")
MAX_DUMP_LINES = 3000
LEGACY_FILES = re.compile(r"fsdp_workers\.py|dp_actor\.py|dp_critic\.py|sharding_manager/")
ENGINE_FILES = re.compile(r"engine_workers\.py|/workers/engine/|/trainer/ppo/v1/")


@dataclass
class RecoveredConfig:
    """What the log says of the config: where it was read (``source``: "" when nowhere), the overrides, and the
    profile its frames show (None: they do not say)."""

    source: str = ""
    overrides: list[str] = field(default_factory=list)
    profile: str | None = None
    notes: list[str] = field(default_factory=list)


def _value(v: Any) -> str | None:
    """A Python value from the dump as a Hydra override value (None for lists and dicts, which labkit does not
    read from a dump)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return v if re.fullmatch(r"[\w./:@+-]*", v) and v else "'" + v.replace("'", "\\'") + "'"
    return None


def _flatten(node: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in node.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _flatten(v, path + ".")
            continue
        text = _value(v)
        if text is not None:
            out.append(f"{path}={text}")
    return out


def _balanced_end(lines: list[LogLine], start: int) -> int | None:
    """The index of the line closing the dict opened at ``lines[start]`` (brackets outside quotes), or None."""
    depth, quote = 0, ""
    for k in range(start, min(len(lines), start + MAX_DUMP_LINES)):
        text = lines[k].text
        i = 0
        while i < len(text):
            c = text[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "{[(":
                depth += 1
            elif c in "}])":
                depth -= 1
                if depth == 0:
                    return k
            i += 1
    return None


def _from_dump(lines: list[LogLine]) -> RecoveredConfig | None:
    for k, line in enumerate(lines):
        if not DUMP_START.match(line.text.strip()):
            continue
        end = _balanced_end(lines, k)
        if end is None:
            return RecoveredConfig(notes=[f"line {line.number}: verl's config dump is cut off; not read"])
        text = " ".join(x.text.strip() for x in lines[k : end + 1])
        try:
            tree = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return RecoveredConfig(notes=[f"line {line.number}: verl's config dump is not a Python literal; not read"])
        if isinstance(tree, dict):
            return RecoveredConfig(f"verl's config dump (line {line.number})", _flatten(tree))
    return None


def _from_hydra(lines: list[LogLine]) -> RecoveredConfig | None:
    for line in lines:
        m = HYDRA.search(line.text)
        if not m:
            continue
        try:
            items = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            # cut off: the complete items before the cut
            items = re.findall(r"'((?:[^'\\]|\\.)*)'(?=, |\])", m.group(1))
            if not items:
                return None
            note = f"line {line.number}: Hydra's override list is cut off; read the {len(items)} complete item(s)"
            return RecoveredConfig(f"Hydra's override list (line {line.number})", list(items)[:-1], notes=[note])
        if isinstance(items, list):
            return RecoveredConfig(f"Hydra's override list (line {line.number})", [str(x) for x in items])
    return None


def _from_command(lines: list[LogLine]) -> RecoveredConfig | None:
    for k, line in enumerate(lines):
        m = COMMAND.search(line.text)
        if not m or line.text.rstrip().endswith("..."):
            continue
        parts = [m.group(1)]
        j = k
        while parts[-1].rstrip().endswith("\\") and j + 1 < len(lines):
            j += 1
            parts.append(lines[j].text)
        try:
            read = read_config_text("\n".join(parts))
        except ConfigError as exc:
            return RecoveredConfig(notes=[f"line {line.number}: the launch command is not readable: {exc}"])
        notes = [f"not read: {arg} ({why})" for arg, why in read.not_read]
        return RecoveredConfig(f"the launch command (line {line.number})", read.overrides, notes=notes)
    return None


def profile_of(lines: list[LogLine]) -> str | None:
    """legacy when the frames run verl's legacy workers, engine when its engine workers, else None."""
    legacy = any(LEGACY_FILES.search(line.text) for line in lines if "File " in line.text)
    engine = any(ENGINE_FILES.search(line.text) for line in lines if "File " in line.text)
    return "legacy" if legacy and not engine else "engine" if engine and not legacy else None


def recover_config(lines: list[LogLine]) -> RecoveredConfig:
    """The richest config the log holds (the dump, then Hydra's list, then the command line) and its profile."""
    found = RecoveredConfig()
    notes: list[str] = []
    for reader in (_from_dump, _from_hydra, _from_command):
        got = reader(lines)
        if got is None:
            continue
        notes += got.notes
        if got.source:
            found = got
            break
    found.notes = notes
    found.profile = profile_of(lines)
    return found


def build_config(overrides: list[str], profile: str) -> tuple[VerlConfig, list[str]]:
    """The config the overrides describe, applied one by one: those labkit cannot apply (keys of another verl
    version, values it refuses) are listed, not fatal."""
    cfg = VerlConfig(profile=profile)
    skipped = []
    for item in overrides:
        try:
            cfg.override([item])
        except ConfigError as exc:
            skipped.append(f"{item[:120]} ({str(exc)[:160]})")
    return cfg, skipped
