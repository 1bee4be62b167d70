"""How a verl config takes a value: one key set and checked against its type and the release's schema (a key verl
has but labkit does not model is kept aside, a key of another release or inside one of verl's open mappings is the
stop verl's Hydra makes, a typo names the closest key or, leniently, is set aside), and Hydra's override grammar
(``a.b=1``, ``+a.b=1``, ``++a.b=1``, ``~a.b``, the ``model_engine`` group). Mirrors ``hydra``'s override parser and
struct mode as ``verl/trainer/main_ppo.py`` runs them. ``labkit.config.verl_config.VerlConfig`` inherits it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import yaml

from labkit.config.hydra_overrides import HydraError, parse_override
from labkit.config.key_values import closest_key, coerce, hydra_stop, open_mapping, profile_keys, verl_keys
from labkit.config.keys import ACTOR, KEYS
from labkit.config.messages import ConfigError
from labkit.config.yaml_input import YamlInputError, describe, load_yaml


@lru_cache(maxsize=4096)
def _parsed(raw: str) -> Any:
    return load_yaml(raw)


def _override_value(raw: str) -> Any:
    """An override's value as YAML reads it; memoised (a panel re-reads the same few dozen values on every change)."""
    value = _parsed(raw)
    return copy.deepcopy(value) if isinstance(value, (list, dict)) else value


class ConfigOverrides:
    """The writing half of ``VerlConfig``: ``set``, ``override`` and ``select_engine`` over its tables."""

    profile: str
    values: dict[str, Any]
    ignored: dict[str, Any]
    added: dict[str, Any]
    hydra_stops: list[str]
    lenient: bool
    unknown: dict[str, str]

    def set(self, path: str, value: Any, origin: str = "override") -> Any:
        """Set one key (validated); unknown keys raise with the closest known key."""
        key = KEYS.get(path)
        if key is None or self.profile not in key.profiles:
            if key is None and path in verl_keys():
                self.ignored[path] = value
                return self
            if key is not None or open_mapping(path) is not None or path.endswith(".model_engine"):
                # verl's Hydra (struct mode) stops: a key of another release, a new key inside one of verl's mappings,
                # or the backend set under the actor (verl's own examples at newer commits do both). Recorded, and the
                # rest of the config is still read, so the answer can say what verl would do without it.
                self.hydra_stops.append(f"{origin}: {hydra_stop(self.profile, path, value, key)}")
                return self
            hint = closest_key(path)
            if self.lenient:
                self.unknown[f"{path}={value}"] = "not a key of any verl release labkit reads" + (
                    f" (did you mean '{hint}'?)" if hint else ""
                )
                return self
            raise ConfigError(f"{origin}: unknown key '{path}'." + (f" Did you mean '{hint}'?" if hint else ""))
        self.values[path] = coerce(key, value, origin)
        return self

    def override(self, overrides: Iterable[str]) -> Any:
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
        return path not in profile_keys(self.profile)

    def _holds_value(self, path: str) -> bool:
        """Whether ``path`` already holds a non-null value (Hydra's ``+`` refuses to add it again)."""
        key = KEYS.get(path)
        if key is None or self.profile not in key.profiles:
            return False  # an unmodelled verl key: its YAML value is not known here
        if path in self.values:
            return self.values[path] is not None
        return key.follows is not None or key.default_for(self.profile) is not None
