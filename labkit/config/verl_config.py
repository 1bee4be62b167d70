"""A verl configuration as labkit sees it: verl-style YAML plus Hydra-style overrides, per profile.

Mirrors how ``verl/trainer/main_ppo.py: main`` receives its config (``ppo_trainer.yaml`` + ``a.b.c=value``
overrides); only the batching-relevant keys (``labkit.config.keys``) are modelled, other verl keys are accepted
and listed in ``VerlConfig.ignored``; keys verl does not know are an error naming the closest known key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from labkit.config.config_overrides import ConfigOverrides
from labkit.config.key_values import (
    INTERP,
    closest_key,
    coerce,
    flatten,
)
from labkit.config.keys import KEYS, PROFILES, Key
from labkit.config.messages import ConfigError
from labkit.config.versions import Release
from labkit.config.yaml_input import MAX_FILE_BYTES, YamlInputError, describe, load_yaml, read_config_text

_NONE = object()
"""No value (a release's YAML that does not set a key)."""


@dataclass
class VerlConfig(ConfigOverrides):
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
                m = INTERP.match(value.strip())
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
            m = INTERP.match(value.strip())
            if m:
                target = m.group(1).strip()
                return self.get(target, (key.path,)) if target in KEYS else _NONE
        if value is None and not key.nullable:
            return _NONE
        return coerce(key, value, f"verl {rel.version}'s default of '{key.path}'")

    def _resolve(self, path: str, m: re.Match, seen: tuple) -> Any:
        target, fallback = m.group(1).strip(), m.group(2)
        if target.startswith("."):
            target = path.rsplit(".", 1)[0] + target
        if target in KEYS:
            return coerce(KEYS[path], self.get(target, seen), f"interpolation of '{path}'")
        if fallback is None:
            raise ConfigError(f"'{path}' interpolates '{target}', which labkit does not model.")
        try:
            default = load_yaml(fallback)
        except (yaml.YAMLError, YamlInputError) as exc:
            why = describe(exc) if isinstance(exc, yaml.YAMLError) else exc
            raise ConfigError(f"'{path}': cannot parse the interpolation default {fallback!r}: {why}") from None
        return coerce(KEYS[path], default, f"interpolation default of '{path}'")

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
    for key, value in flatten(tree).items():
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
