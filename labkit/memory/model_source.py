"""Which model a config trains: ``actor_rollout_ref.model.path`` read for its shape, the one rule the CLI and the
dashboard share.

verl loads the actor from ``actor_rollout_ref.model.path`` (a Hugging Face repo id or a local folder,
``verl/workers/fsdp_workers.py: _build_model_optimizer`` via ``AutoConfig.from_pretrained``). labkit prices the same
model: a name ``data/model_shapes.json`` knows (its key, HF repo id or the id's basename, so ``~/models/Qwen2.5-7B-
Instruct`` matches too), else a local folder whose ``config.json`` gives the shape. Anything else is an error asking
for ``--model``: a memory verdict for a model the user does not train is worse than none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labkit.config.keys import MODEL
from labkit.config.verl_config import ConfigError
from labkit.memory.shapes import ARCHITECTURES, DATA, ModelShape, model_names, model_shape

PATH_KEY = f"{MODEL}.path"
_HF_TYPES = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama", "mistral": "llama"}


def shape_from_config_json(folder: str | Path) -> ModelShape:
    """The shape a Hugging Face ``config.json`` in ``folder`` describes (qwen2, qwen3, llama, mistral decoders);
    ConfigError when it is missing, unreadable or another architecture."""
    file = Path(folder).expanduser() / "config.json"
    try:
        c = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from None
    arch = _HF_TYPES.get(str(c.get("model_type", "")).lower())
    if arch is None or arch not in ARCHITECTURES:
        raise ConfigError(
            f"{file}: model_type {c.get('model_type')!r} is not a decoder labkit models (qwen2, qwen3, llama); "
            "pass --model NAME"
        )
    try:
        heads, hidden = int(c["num_attention_heads"]), int(c["hidden_size"])
        shape = ModelShape(
            name=Path(folder).expanduser().resolve().name,
            architecture=arch,
            hidden_size=hidden,
            num_hidden_layers=int(c["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads),
            intermediate_size=int(c["intermediate_size"]),
            vocab_size=int(c["vocab_size"]),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            attention_bias=bool(c.get("attention_bias", arch == "qwen2")),
            qk_norm=arch == "qwen3",
            max_position_embeddings=int(c.get("max_position_embeddings") or 0),
            published_params=0,
            source=str(folder),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{file}: cannot read the shape ({exc!r} missing or not a number); pass --model NAME"
        ) from None
    return shape


def _known(path: str) -> ModelShape | None:
    for name in (path, path.rstrip("/").rsplit("/", 1)[-1]):
        try:
            return model_shape(name)
        except KeyError:
            continue
    return None


def _folder(path: str) -> Path | None:
    """A local folder with a config.json: as given (relative to the working directory), else relative to this
    repository (labkit's default config trains ``data/tiny-qwen2``)."""
    for base in (Path.cwd(), DATA.parent):
        p = (base / Path(path).expanduser()) if not Path(path).expanduser().is_absolute() else Path(path).expanduser()
        if (p / "config.json").is_file():
            return p
    return None


def model_for(cfg: Any, explicit: str | None = None) -> ModelShape:
    """The shape to price: ``explicit`` (``--model`` / the dashboard's choice) when given, else the model
    ``actor_rollout_ref.model.path`` names (a known shape, or a local folder's config.json). ConfigError otherwise,
    one line asking for --model."""
    if explicit:
        try:
            return model_shape(explicit)
        except KeyError as exc:
            raise ConfigError(str(exc.args[0])) from None
    path = str(cfg.get(PATH_KEY) or "")
    known = _known(path) if path else None
    if known is not None:
        return known
    folder = _folder(path) if path else None
    if folder is not None:
        return shape_from_config_json(folder)
    raise ConfigError(
        f"{PATH_KEY}={path!r} is neither a model labkit knows nor a local folder with a config.json: "
        f"pass --model NAME (one of {', '.join(model_names())})"
    )
