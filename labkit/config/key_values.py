"""What a verl key accepts, apart from any one config: every key of the verl releases labkit reads (their generated
``ppo_trainer.yaml``s), the keys of the release a profile models, the open mappings verl passes through, Hydra's
words when an override names a key the release lacks, the closest known key to a typo, and a value checked and
converted to its key's type. ``labkit.config.verl_config.VerlConfig`` is their one user.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from labkit.config.keys import BOOL, FLOAT, INT, KEYS, STR, STRLIST, Key
from labkit.config.messages import ConfigError

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
INTERP = re.compile(r"^\$\{(?:oc\.select:)?\s*([^,}]+?)\s*(?:,\s*([^}]*))?\}$")
"""An OmegaConf interpolation, ``${path}`` or ``${oc.select:path,default}``."""
MAX_SIZE = 2**48
"""The largest integer a key may hold: beyond it no GPU, batch or index is real (and numpy's index type ends)."""


@lru_cache(maxsize=1)
def verl_keys() -> frozenset[str]:
    """Every key of verl's generated ppo_trainer.yaml (0.7.1 and 0.9.1) and of the releases before 0.5 (their own
    ppo_trainer.yaml, ``data/verl_old_releases.json``): accepted, not modelled."""
    blob = json.loads((DATA_DIR / "verl_config_keys.json").read_text())
    old = json.loads((DATA_DIR / "verl_old_releases.json").read_text())["releases"]
    return frozenset(k for keys in [*blob["keys"].values(), *old.values()] for k in keys)


@lru_cache(maxsize=2)
def profile_keys(profile: str) -> frozenset[str]:
    """The keys of the verl release a profile models (0.9.1 for engine, 0.7.1 for legacy)."""
    blob = json.loads((DATA_DIR / "verl_config_keys.json").read_text())
    return frozenset(blob["keys"]["0.9.1" if profile == "engine" else "0.7.1"])


def open_mapping(path: str) -> str | None:
    """The key of verl's config that ``path`` lies inside (``rollout.engine_kwargs.sglang`` for
    ``rollout.engine_kwargs.sglang.attention_backend``): a mapping whose keys verl leaves open, or None."""
    known = verl_keys()
    parts = path.split(".")
    for k in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:k])
        if prefix in known:
            return prefix
    return None


def hydra_stop(profile: str, path: str, value: Any, key: Key | None) -> str:
    """Hydra's text when an override names a key the profile's verl does not have (``+`` would add it)."""
    version = "0.9.1" if profile == "engine" else "0.7.1"
    text = f"verl {version}'s Hydra stops: Could not override '{path}'. To append to your config use +{path}={value}"
    if key is not None:
        return f"{text} (the key exists in the {', '.join(key.profiles)} profile's verl only)"
    if path.endswith(".model_engine"):
        return f"{text} (verl {version} picks the backend with the top-level group model_engine=megatron)"
    return f"{text} ('{open_mapping(path)}' is a mapping of verl's config: Hydra adds a key to it only with '+')"


def closest_key(path: str, candidates: Iterable[str] | None = None) -> str | None:
    """The known key closest to ``path`` (difflib on the full dotted path, then on the leaf name)."""
    pool = list(candidates or KEYS)
    best = difflib.get_close_matches(path, pool, n=1, cutoff=0.6)
    if best:
        return best[0]
    leaf = path.rsplit(".", 1)[-1]
    by_leaf = {p.rsplit(".", 1)[-1]: p for p in pool}
    leaf_best = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
    return by_leaf[leaf_best[0]] if leaf_best else None


def coerce(key: Key, value: Any, origin: str) -> Any:
    """Check and convert one value to the key's type; clear errors for wrong types and bad sizes."""
    if isinstance(value, str) and INTERP.match(value.strip()):
        return value  # resolved later, against the whole config
    if value is None:
        if key.nullable:
            return None
        follows = f"; leave it unset to follow '{key.follows}'" if key.follows else ""
        raise ConfigError(f"{origin}: '{key.path}' cannot be null (expected {key.type}){follows}.")
    if key.type == BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif key.type == INT:
        if isinstance(value, int) and not isinstance(value, bool):
            out = value
        elif isinstance(value, float) and value.is_integer():
            out = int(value)
        else:
            out = None
        if out is not None:
            if abs(out) > MAX_SIZE:
                raise ConfigError(f"{origin}: '{key.path}' is {out:.3g}; labkit reads sizes up to 2**48.")
            if key.minimum is not None and out < key.minimum:
                raise ConfigError(f"{origin}: '{key.path}' must be >= {int(key.minimum)}, got {out}.")
            return out
    elif key.type == FLOAT:
        if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-3 as a string; Hydra's grammar reads it as a float
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{origin}: '{key.path}' must be a finite number, got {value}.")
            if key.minimum is not None and value < key.minimum:
                raise ConfigError(f"{origin}: '{key.path}' must be >= {key.minimum}, got {value}.")
            return float(value)
    elif key.type == STRLIST:
        if isinstance(value, str) and not value.strip().startswith("["):
            value = [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
    elif key.type == STR:
        if isinstance(value, str):
            if key.choices and value not in key.choices:
                raise ConfigError(f"{origin}: '{key.path}' must be one of {list(key.choices)}, got {value!r}.")
            return value
    raise ConfigError(f"{origin}: '{key.path}' expects {key.type}, got {value!r} ({type(value).__name__}).")


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, path + "."))
        else:
            out[path] = v
    return out
