"""The one decision the CLI, the dashboard and the notebooks share: which model on which GPU a config is priced
for, as ``MemorySettings`` (the model from ``model_source.model_for``, capacity and headroom from
``headroom.gpu_settings``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from labkit.config.messages import ConfigError
from labkit.memory.gpus import gpu_names
from labkit.memory.headroom import gpu_settings
from labkit.memory.model_source import default_model_note, model_for, stand_in_note
from labkit.memory.settings import MemorySettings
from labkit.rules.run import as_run

MIN_CAPACITY, MAX_CAPACITY = 2**30, 2**50
MAX_MARGIN_GIB = 10**6


def settings_for(
    cfg: Any,
    model: str | None = None,
    gpu_name: str | None = None,
    capacity: int | None = None,
    margin_gib: float | None = None,
) -> MemorySettings:
    """The settings ``labkit memory`` and the dashboard price: ``model`` (None: the one
    ``actor_rollout_ref.model.path`` names), GPU ``gpu_name`` (None: an H100 80 GB) at its reported capacity unless
    ``capacity`` is given, the margin in GiB (None: data/gpus.json's). ConfigError (one line) otherwise."""
    run = as_run(cfg)  # a config is resolved once here; a run is used as it is
    if margin_gib is not None and not 0 <= margin_gib <= MAX_MARGIN_GIB:  # NaN fails both
        raise ConfigError(f"--margin: {margin_gib} GiB; use a number from 0 to {MAX_MARGIN_GIB:,}")
    if gpu_name is not None and not gpu_name.strip():
        raise ConfigError("--gpu: an empty name; use one of " + ", ".join(gpu_names()))
    if capacity is not None and not MIN_CAPACITY <= capacity <= MAX_CAPACITY:
        raise ConfigError(f"--gpu-memory: {capacity:,} bytes; a GPU's capacity is 1 GiB to 1 PiB (e.g. 80GiB, 141GB)")
    try:
        g = gpu_settings(run.geometry, gpu_name, capacity, margin_gib)
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    s = MemorySettings.from_config(run, model_for(run, model), g.pop("gpu_bytes"), **g)
    if s.model.vision is None:
        return s
    return replace(s, image_tokens_per_sample=min(s.image_tokens_per_sample, s.prompt_length))  # verl: in the prompt


def model_note(cfg: Any, model: str | None) -> str | None:
    """The stand-in note ``labkit memory`` prints first when ``--model`` prices another model than the config's
    ``actor_rollout_ref.model.path`` names (``labkit.memory.model_source.stand_in_note``); None when they agree."""
    return default_model_note(cfg, model) or stand_in_note(cfg, model)
