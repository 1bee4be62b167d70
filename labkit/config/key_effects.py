"""The memory effect of every verl key (``data/key_effects.yaml``): *priced* (labkit's memory model reads it),
*not priced* (it can change GPU memory, labkit does not model how: ``would`` says what it changes) or *none* (no
GPU memory effect: ``why``). The open mappings verl passes through (megatron-core's TransformerConfig,
OptimizerConfig and DDP config, Hugging Face's config, vLLM's and SGLang's engine arguments) are classified by
their sub-keys. The first entry whose glob matches a key decides it; a key no entry matches is ``unclassified``
(a test keeps every key of verl's own YAMLs classified).

``unpriced`` is what an answer names: each key a config sets that the memory model did not read (the answer
records what it reads: ``VerlConfig.recording``), with its effect and why; never a silent acceptance.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from labkit.config.unread_keys import never_read

REGISTRY = Path(__file__).resolve().parents[2] / "data" / "key_effects.yaml"
EFFECTS = ("priced", "not_priced", "none")


@dataclass(frozen=True)
class Effect:
    """A key's class and the sentence that goes with it (what it would change, or why it changes nothing)."""

    effect: str
    text: str
    pattern: str
    silent: bool = False
    """verl reads the key and then ignores it: no effect, but an answer names it (the user set it for one)."""


@cache
def _entries() -> tuple[tuple[re.Pattern, Effect], ...]:
    out = []
    for entry in yaml.safe_load(REGISTRY.read_text()):
        effect = entry["effect"]
        text = entry.get("would") or entry.get("why") or entry.get("how") or ""
        for pattern in entry["keys"]:
            out.append(
                (re.compile(fnmatch.translate(pattern)), Effect(effect, text, pattern, bool(entry.get("silent"))))
            )
    return tuple(out)


@cache
def effect_of(key: str) -> Effect | None:
    """The class of ``key`` (the first matching entry), or None when no entry matches."""
    for pattern, effect in _entries():
        if pattern.match(key):
            return effect
    return None


def _shown(value: Any) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def unpriced(
    cfg: Any, read: set[str], extra_priced: tuple[str, ...] = (), path: str | None = None
) -> list[dict[str, str]]:
    """Every key ``cfg`` sets (its YAML or overrides, ``+`` keys included) that the memory answer did not read:
    ``{"key", "value", "effect", "text"}`` with ``effect`` ``not_priced`` (what it would change), ``not_read`` (a
    key labkit prices, which this config does not use: a silent behaviour of verl or a role this run lacks),
    ``no_effect`` (verl reads it and ignores it), ``not_verl`` (no verl release has it: a fork's key, a recipe's, a
    typo) or ``read_past`` (a launch script's entry point or base YAML read as main_ppo's); keys of no memory effect
    are left out.
    ``extra_priced``: keys read outside the recording (the model path). ``path``: the run's audited
    ``"<release> <loop> <engine>"`` (``labkit.config.unread_keys``): a key that verl never reads there is named
    ``no_effect`` with the code that reads it elsewhere, whatever its class."""
    out = []
    seen = set(read) | set(extra_priced)
    tables = (getattr(cfg, "values", {}), getattr(cfg, "ignored", {}), getattr(cfg, "added", {}))
    for table in tables:
        for key, value in table.items():
            if key in seen:
                continue
            seen.add(key)
            unread_here = never_read(key, path)
            if unread_here is not None:
                out.append({"key": key, "value": _shown(value), "effect": "no_effect", "text": unread_here})
                continue
            e = effect_of(key)
            if e is not None and e.silent:
                out.append({"key": key, "value": _shown(value), "effect": "no_effect", "text": e.text})
                continue
            if e is None or e.effect == "none":
                continue
            if e.effect == "priced":
                out.append({"key": key, "value": _shown(value), "effect": "not_read", "text": NOT_USED})
            else:
                out.append({"key": key, "value": _shown(value), "effect": "not_priced", "text": e.text})
    for item, why in getattr(cfg, "unknown", {}).items():
        key, eq, value = item.partition("=")
        if not eq:  # what a launch script's reading set aside: another entry point, a recipe's base YAML
            out.append({"key": key, "value": "", "effect": "read_past", "text": why})
            continue
        out.append({"key": key, "value": _shown(value), "effect": "not_verl", "text": f"{why}; ignored for memory"})
    return out


NOT_USED = "not used by this run's roles or settings (e.g. a critic's key without a critic); no memory effect here"
