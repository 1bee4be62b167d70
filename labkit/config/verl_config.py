"""A verl configuration as labkit sees it: verl-style YAML plus Hydra-style overrides, per profile.

Mirrors how ``verl/trainer/main_ppo.py: main`` receives its config (``ppo_trainer.yaml`` + ``a.b.c=value``
overrides); only the batching-relevant keys (``labkit.config.keys``) are modelled, other verl keys are accepted
and listed in ``VerlConfig.ignored``; keys verl does not know are an error naming the closest known key.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from labkit.config.hydra_overrides import HydraError, parse_override
from labkit.config.keys import ACTOR, BOOL, FLOAT, INT, KEYS, PROFILES, STR, STRLIST, Key
from labkit.config.messages import InputError
from labkit.config.versions import Release
from labkit.config.yaml_input import MAX_FILE_BYTES, YamlInputError, describe, load_yaml, read_config_text

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
_INTERP = re.compile(r"^\$\{(?:oc\.select:)?\s*([^,}]+?)\s*(?:,\s*([^}]*))?\}$")


@lru_cache(maxsize=4096)
def _parsed(raw: str) -> Any:
    return load_yaml(raw)


def _override_value(raw: str) -> Any:
    """An override's value as YAML reads it; memoised (a panel re-reads the same few dozen values on every change)."""
    value = _parsed(raw)
    return copy.deepcopy(value) if isinstance(value, (list, dict)) else value


_NONE = object()
"""No value (a release's YAML that does not set a key)."""

MAX_SIZE = 2**48
"""The largest integer a key may hold: beyond it no GPU, batch or index is real (and numpy's index type ends)."""


class ConfigError(InputError):
    """A config labkit cannot read: unknown key, wrong type, out-of-range size, malformed YAML."""


def _verl_keys() -> set[str]:
    """Every key of verl's generated ppo_trainer.yaml (0.7.1 and 0.9.1) and of the releases before 0.5 (their own
    ppo_trainer.yaml, ``data/verl_old_releases.json``): accepted, not modelled."""
    blob = json.loads((DATA_DIR / "verl_config_keys.json").read_text())
    old = json.loads((DATA_DIR / "verl_old_releases.json").read_text())["releases"]
    return {k for keys in [*blob["keys"].values(), *old.values()] for k in keys}


_VERL_KEYS: set[str] | None = None


@lru_cache(maxsize=2)
def _profile_keys(profile: str) -> frozenset[str]:
    """The keys of the verl release a profile models (0.9.1 for engine, 0.7.1 for legacy)."""
    blob = json.loads((DATA_DIR / "verl_config_keys.json").read_text())
    return frozenset(blob["keys"]["0.9.1" if profile == "engine" else "0.7.1"])


def _open_mapping(path: str) -> str | None:
    """The key of verl's config that ``path`` lies inside (``rollout.engine_kwargs.sglang`` for
    ``rollout.engine_kwargs.sglang.attention_backend``): a mapping whose keys verl leaves open, or None."""
    global _VERL_KEYS
    if _VERL_KEYS is None:
        _VERL_KEYS = _verl_keys()
    parts = path.split(".")
    for k in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:k])
        if prefix in _VERL_KEYS:
            return prefix
    return None


def _hydra_stop(profile: str, path: str, value: Any, key: Key | None) -> str:
    """Hydra's text when an override names a key the profile's verl does not have (``+`` would add it)."""
    version = "0.9.1" if profile == "engine" else "0.7.1"
    text = f"verl {version}'s Hydra stops: Could not override '{path}'. To append to your config use +{path}={value}"
    if key is not None:
        return f"{text} (the key exists in the {', '.join(key.profiles)} profile's verl only)"
    if path.endswith(".model_engine"):
        return f"{text} (verl {version} picks the backend with the top-level group model_engine=megatron)"
    return f"{text} ('{_open_mapping(path)}' is a mapping of verl's config: Hydra adds a key to it only with '+')"


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


def _coerce(key: Key, value: Any, origin: str) -> Any:
    """Check and convert one value to the key's type; clear errors for wrong types and bad sizes."""
    if isinstance(value, str) and _INTERP.match(value.strip()):
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


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, path + "."))
        else:
            out[path] = v
    return out


@dataclass
class VerlConfig:
    """Explicitly set values over verl's defaults, for one profile; ``get`` resolves interpolations."""

    profile: str = "engine"
    values: dict[str, Any] = field(default_factory=dict)
    ignored: dict[str, Any] = field(default_factory=dict)
    added: dict[str, Any] = field(default_factory=dict)  # +key=value outside verl's schema: accepted, not modelled
    release: Release | None = None  # the verl release the user named (--verl), else None: the profile's own version
    hydra_stops: list[str] = field(default_factory=list)  # overrides verl's Hydra refuses (the rest is still read)
    lenient: bool = False
    """``labkit memory``: a key no verl release has (a fork's, a recipe's, a typo) is recorded in ``unknown`` and the
    answer goes on without it, instead of refusing the config."""
    unknown: dict[str, str] = field(default_factory=dict)
    """What a lenient read set aside: key (or Hydra flag) -> why it is ignored for memory."""
    _reads: set[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"profile must be one of {list(PROFILES)}, got {self.profile!r}.")

    # -- reading ---------------------------------------------------------------------------------
    @contextmanager
    def recording(self) -> Iterator[set[str]]:
        """Within the block, every key read (``get`` and ``raw``) is added to the yielded set: what an answer used."""
        previous, self._reads = self._reads, set()
        try:
            yield self._reads
        finally:
            reads, self._reads = self._reads, previous
            if previous is not None:
                previous |= reads

    def raw(self, path: str, default: Any = None) -> Any:
        """A key labkit's schema does not model, as the user set it (values, ignored or added overrides), else
        ``default``; recorded like ``get``."""
        if self._reads is not None:
            self._reads.add(path)
        for table in (self.values, self.ignored, self.added):
            if path in table:
                return table[path]
        return default

    def get(self, path: str, _seen: tuple = ()) -> Any:
        """The effective value of ``path``: set value, else the followed key, else verl's default."""
        if self._reads is not None:
            self._reads.add(path)
        key = KEYS.get(path)
        if key is None:
            hint = closest_key(path)
            raise ConfigError(f"Unknown key '{path}'." + (f" Did you mean '{hint}'?" if hint else ""))
        if path in _seen:
            raise ConfigError(f"Interpolation cycle: {' -> '.join(_seen + (path,))}")
        if path in self.values:
            value = self.values[path]
            if isinstance(value, str):
                m = _INTERP.match(value.strip())
                if m:
                    return self._resolve(path, m, _seen + (path,))
            return value
        old = self._old_default(key)
        if old is not _NONE:
            return old
        if key.follows is not None:
            return self.get(key.follows, _seen + (path,))
        return key.default_for(self.profile)

    def _old_default(self, key: Key) -> Any:
        """A release before 0.5 (``--verl 0.3``): its own YAML's default of ``key`` (interpolations resolved against
        this config), or ``_NONE`` when its YAML has no value labkit can take for it."""
        rel = self.release
        if rel is None or not rel.has_key(key.path):
            return _NONE
        value = rel.yaml_default(key.path)
        if isinstance(value, str):
            m = _INTERP.match(value.strip())
            if m:
                target = m.group(1).strip()
                return self.get(target, (key.path,)) if target in KEYS else _NONE
        if value is None and not key.nullable:
            return _NONE
        return _coerce(key, value, f"verl {rel.version}'s default of '{key.path}'")

    def _resolve(self, path: str, m: re.Match, seen: tuple) -> Any:
        target, fallback = m.group(1).strip(), m.group(2)
        if target.startswith("."):
            target = path.rsplit(".", 1)[0] + target
        if target in KEYS:
            return _coerce(KEYS[path], self.get(target, seen), f"interpolation of '{path}'")
        if fallback is None:
            raise ConfigError(f"'{path}' interpolates '{target}', which labkit does not model.")
        try:
            default = load_yaml(fallback)
        except (yaml.YAMLError, YamlInputError) as exc:
            why = describe(exc) if isinstance(exc, yaml.YAMLError) else exc
            raise ConfigError(f"'{path}': cannot parse the interpolation default {fallback!r}: {why}") from None
        return _coerce(KEYS[path], default, f"interpolation default of '{path}'")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in (
            "profile", "values", "ignored", "added", "release", "hydra_stops", "lenient", "unknown"
        ):  # fmt: skip
            raise AttributeError(name)
        return _Node(self, name)

    def is_set(self, path: str) -> bool:
        """True when the user set ``path`` (YAML or override), as opposed to inheriting a default."""
        return path in self.values

    def to_dict(self) -> dict:
        """Nested dict of every modelled key's effective value (what verl's workers would see)."""
        out: dict = {}
        for path, key in KEYS.items():
            if self.profile not in key.profiles:
                continue
            node = out
            *parents, leaf = path.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = self.get(path)
        return out

    # -- writing ---------------------------------------------------------------------------------
    def set(self, path: str, value: Any, origin: str = "override") -> VerlConfig:
        """Set one key (validated); unknown keys raise with the closest known key."""
        global _VERL_KEYS
        key = KEYS.get(path)
        if key is None or self.profile not in key.profiles:
            if _VERL_KEYS is None:
                _VERL_KEYS = _verl_keys()
            if key is None and path in _VERL_KEYS:
                self.ignored[path] = value
                return self
            if key is not None or _open_mapping(path) is not None or path.endswith(".model_engine"):
                # verl's Hydra (struct mode) stops: a key of another release, a new key inside one of verl's mappings,
                # or the backend set under the actor (verl's own examples at newer commits do both). Recorded, and the
                # rest of the config is still read, so the answer can say what verl would do without it.
                self.hydra_stops.append(f"{origin}: {_hydra_stop(self.profile, path, value, key)}")
                return self
            hint = closest_key(path)
            if self.lenient:
                self.unknown[f"{path}={value}"] = "not a key of any verl release labkit reads" + (
                    f" (did you mean '{hint}'?)" if hint else ""
                )
                return self
            raise ConfigError(f"{origin}: unknown key '{path}'." + (f" Did you mean '{hint}'?" if hint else ""))
        self.values[path] = _coerce(key, value, origin)
        return self

    def override(self, overrides: Iterable[str]) -> VerlConfig:
        """Apply Hydra overrides (``labkit.config.hydra_overrides``): ``a.b=1``; ``+a.b=1`` adds a key (a key
        outside verl's schema is kept in ``added``, not modelled; Hydra's error when the key already holds a
        value); ``++a.b=1`` adds or sets; ``~a.b`` deletes (a modelled key goes back to verl's default)."""
        for item in overrides:
            try:
                ov = parse_override(item)
            except HydraError as exc:
                raise ConfigError(str(exc)) from None
            path = ov.key
            if ov.is_group:
                self.ignored[path] = ov.raw
                if path == "model_engine":
                    self.select_engine((ov.raw or "").strip())
                continue
            if ov.prefix == "~":
                if path not in KEYS:
                    self.set(path, None, origin=f"'{item}'")  # raises for unknown keys
                self.values.pop(path, None)
                self.ignored.pop(path, None)
                self.added.pop(path, None)
                continue
            raw = ov.raw or ""
            try:
                value = _override_value(raw) if raw.strip() else None
            except yaml.YAMLError as exc:
                raise ConfigError(f"Override '{item}': cannot parse value {raw!r}: {describe(exc)}") from None
            except YamlInputError as exc:
                raise ConfigError(f"Override '{item}': cannot parse value {raw!r}: {exc}") from None
            if ov.prefix and self._outside_schema(path):
                self.added[path] = value
                continue
            if ov.prefix == "+" and self._holds_value(path):
                raise ConfigError(f"Could not append to config. An item is already at '{path}'.")
            self.set(path, value, origin=f"override '{item}'")
        return self

    def select_engine(self, choice: str) -> None:
        """``model_engine=dp|megatron|veomni`` (0.9.1's config group; ``--config-name ppo_megatron_trainer`` picks megatron):
        the group sets ``strategy`` of the actor, ref and critic, as verl's ``model_engine/*.yaml`` does."""
        strategy = choice if choice in ("megatron", "veomni") else "fsdp"
        for path in (f"{ACTOR}.strategy", "critic.strategy"):
            self.values[path] = strategy

    def _outside_schema(self, path: str) -> bool:
        """A key this profile's verl YAML does not have (``+`` adds it, e.g. ``model.override_config.x``, or
        ``+actor.megatron.grad_offload`` on 0.9.1, which has no such key)."""
        key = KEYS.get(path)
        if key is not None and self.profile in key.profiles:
            return False
        return path not in _profile_keys(self.profile)

    def _holds_value(self, path: str) -> bool:
        """Whether ``path`` already holds a non-null value (Hydra's ``+`` refuses to add it again)."""
        key = KEYS.get(path)
        if key is None or self.profile not in key.profiles:
            return False  # an unmodelled verl key: its YAML value is not known here
        if path in self.values:
            return self.values[path] is not None
        return key.follows is not None or key.default_for(self.profile) is not None

    def copy(self) -> VerlConfig:
        return VerlConfig(
            self.profile,
            dict(self.values),
            dict(self.ignored),
            dict(self.added),
            self.release,
            list(self.hydra_stops),
            self.lenient,
            dict(self.unknown),
        )

    # -- derived quantities, named as verl names them ---------------------------------------------
    @property
    def n_gpus(self) -> int:
        """W = trainer.n_gpus_per_node x trainer.nnodes."""
        return self.get("trainer.n_gpus_per_node") * self.get("trainer.nnodes")

    @property
    def need_critic(self) -> bool:
        """Mirrors verl/trainer/ppo/utils.py: need_critic (critic.enable, else adv_estimator == gae)."""
        enable = self.get("critic.enable")
        return bool(enable) if enable is not None else self.get("algorithm.adv_estimator") == "gae"

    @property
    def need_reference_policy(self) -> bool:
        """Mirrors verl/trainer/ppo/utils.py: need_reference_policy (in-reward KL or KL loss); verl up to 0.3 builds
        and runs the reference whatever the KL settings (``main_ppo`` maps ``Role.RefPolicy`` always)."""
        if self.release is not None and self.release.memory.ref_always:
            return True
        return bool(self.get("algorithm.use_kl_in_reward") or self.get("actor_rollout_ref.actor.use_kl_loss"))


class _Node:
    """Attribute access ``cfg.actor_rollout_ref.actor.ppo_mini_batch_size`` over dotted keys."""

    def __init__(self, cfg: VerlConfig, prefix: str) -> None:
        self._cfg, self._prefix = cfg, prefix

    def __getattr__(self, name: str) -> Any:
        path = f"{self._prefix}.{name}"
        if path in KEYS:
            return self._cfg.get(path)
        if any(k.startswith(path + ".") for k in KEYS):
            return _Node(self._cfg, path)
        self._cfg.get(path)  # raises ConfigError with a suggestion


def load_config(
    path: str | Path | None = None, overrides: Iterable[str] = (), profile: str = "engine", lenient: bool = False
) -> VerlConfig:
    """Load a verl-style YAML (optional) and apply Hydra-style overrides, for ``profile`` legacy|engine;
    ``lenient``: keys no verl release has are set aside (``VerlConfig.unknown``), not refused."""
    if path is None:
        return VerlConfig(profile=profile, lenient=lenient).override(overrides)
    try:
        text = read_config_text(path)
    except YamlInputError as exc:
        raise ConfigError(f"{path}: {exc}.") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return load_config_text(text, overrides, profile=profile, origin=str(path), lenient=lenient)


def load_config_text(
    text: str,
    overrides: Iterable[str] = (),
    profile: str = "engine",
    origin: str = "the pasted YAML",
    lenient: bool = False,
) -> VerlConfig:
    """``load_config`` for a YAML document held in a string (a pasted config); ``origin`` prefixes every error."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise ConfigError(f"{origin}: labkit reads configs of at most {MAX_FILE_BYTES:,} bytes.")
    try:
        tree = load_yaml(text)
    except YamlInputError as exc:
        raise ConfigError(f"{origin}: {exc}.") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: malformed YAML: {describe(exc)}") from None
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{origin}: expected a mapping at the top level, got {type(tree).__name__}.")
    for top in ("defaults", "hydra"):
        tree.pop(top, None)
    cfg = VerlConfig(profile=profile, lenient=lenient)
    for key, value in _flatten(tree).items():
        cfg.set(key, value, origin=origin)
    return cfg.override(overrides)


SEED_EXAMPLE = [
    "data.train_batch_size=60",
    "actor_rollout_ref.rollout.n=12",
    "trainer.n_gpus_per_node=6",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=60",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "algorithm.adv_estimator=grpo",
]
"""The worked example of docs/pipeline.md: B=60, n=12, 6 GPUs, rollout TP=2, mini 60, log-prob micro 8."""
