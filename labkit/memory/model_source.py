"""Which model a config trains: ``actor_rollout_ref.model.path`` read for its shape, the one rule the CLI and the
dashboard share.

verl loads the actor from ``actor_rollout_ref.model.path`` (a Hugging Face repo id or a local folder,
``verl/workers/fsdp_workers.py: _build_model_optimizer`` via ``AutoConfig.from_pretrained``). labkit prices the same
model: a name ``data/model_shapes.json`` knows, however verl users write it (``known_shape``: the HF repo id, its
basename, any case, a ``-Instruct``/``-Base``/``-Chat``/``-Thinking``/``-2507``/``-bf16`` variant, a local folder
ending in the name such as ``~/models/Qwen3-30B-A3B-Instruct-2507``), else a local folder whose ``config.json`` gives
the shape (``labkit.memory.shapes_hf.shape_fields``). Anything else is an error naming the 3 closest catalogued models
and ``--model PATH``: a memory verdict for a model the user does not train is worse than none.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from labkit.config.keys import MODEL
from labkit.config.messages import ConfigError
from labkit.memory.data_tables import DATA
from labkit.memory.model_catalogue import model_names, model_shape, shape_from_entry
from labkit.memory.shapes import ModelShape
from labkit.memory.shapes_hf import TEXT_TYPES

PATH_KEY = f"{MODEL}.path"
_VARIANT = re.compile(
    r"([-_](instruct|base|chat|thinking|it|rl|sft|zero|bf16|fp8|hf|mcore|megatron|merge|preview|\d{4}))+$",
    re.IGNORECASE,
)
"""Suffixes that name a checkpoint of the same shape (``Qwen3-30B-A3B-Instruct-2507``, ``MiMo-7B-RL``)."""


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


@cache
def _aliases() -> dict[str, str]:
    """Lower-cased spellings -> catalogue key: the key, its source repo id and basename, each without variant suffixes."""
    out: dict[str, str] = {}
    table = json.loads((DATA / "model_shapes.json").read_text())["models"]
    for key, entry in table.items():
        base = str(entry.get("source", key)).rsplit("/", 1)[-1]
        same = [s for repo in entry.get("same_shape", ()) for s in (repo, repo.rsplit("/", 1)[-1])]
        for spelling in (key, str(entry.get("source", key)), base, *same):
            for s in (spelling, _VARIANT.sub("", spelling)):
                out.setdefault(_norm(s), key)
    return out


def known_shape(path: str) -> ModelShape | None:
    """The catalogued shape ``path`` names (repo id, basename, folder ending in the name, a variant suffix, any case),
    or None."""
    text = str(path).strip().rstrip("/")
    if not text:
        return None
    aliases = _aliases()
    tail = text.rsplit("/", 1)[-1]
    for candidate in (text, tail, "/".join(text.split("/")[-2:])):
        for s in (candidate, _VARIANT.sub("", candidate)):
            if _norm(s) in aliases:
                return model_shape(aliases[_norm(s)])
    return None


def closest_names(path: str, n: int = 3) -> list[str]:
    """The ``n`` catalogued names most like ``path``'s basename (difflib ratio), for the refusal message."""
    tail = _norm(_VARIANT.sub("", str(path).rstrip("/").rsplit("/", 1)[-1]))
    by_norm = {_norm(k): k for k in model_names()}
    close = difflib.get_close_matches(tail, list(by_norm), n=n, cutoff=0.0)
    return [by_norm[c] for c in close]


def shape_from_config_json(folder: str | Path) -> ModelShape:
    """The shape a Hugging Face ``config.json`` in ``folder`` describes (any ``TEXT_TYPES`` model_type, VL configs
    through ``text_config``/``vision_config``); ConfigError when it is missing, unreadable or another architecture."""
    file = Path(folder).expanduser() / "config.json"
    try:
        c = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from None
    if not isinstance(c, dict) or str(c.get("model_type", "")).lower() not in TEXT_TYPES:
        kind = c.get("model_type") if isinstance(c, dict) else None
        raise ConfigError(
            f"{file}: model_type {kind!r} is not an architecture labkit models ({', '.join(sorted(TEXT_TYPES))}); "
            "pass --model NAME"
        )
    name = Path(folder).expanduser().resolve().name
    try:
        return shape_from_entry(name, {"config": c, "source": str(folder)})
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{file}: cannot read the shape ({exc!r} missing or not a number); pass --model NAME"
        ) from None


def _folder(path: str) -> Path | None:
    """A local folder with a config.json: as given (relative to the working directory), else relative to this
    repository (labkit's default config trains ``data/tiny-qwen2``)."""
    for base in (Path.cwd(), DATA.parent):
        try:
            p = Path(path).expanduser()
            p = p if p.is_absolute() else base / p
            if (p / "config.json").is_file():
                return p
        except (OSError, RuntimeError, ValueError):  # a name no file system holds (too long, NUL, no home): no folder
            return None
    return None


def _unknown(what: str, path: str) -> ConfigError:
    return ConfigError(
        f"{what}={path!r} is neither a model labkit knows nor a local folder with a config.json; closest known: "
        f"{', '.join(closest_names(path))}; pass --model NAME, or --model PATH of a folder holding the model's "
        "config.json (see docs/models.md)"
    )


def resolve(path: str, what: str = PATH_KEY) -> ModelShape:
    """The shape ``path`` names: a catalogued model, else a local folder's config.json; ConfigError otherwise."""
    known = known_shape(path)
    if known is not None:
        return known
    folder = _folder(path) if path.strip() else None
    if folder is not None:
        return shape_from_config_json(folder)
    raise _unknown(what, path)


VERL_DEFAULT_PATH = "~/models/deepseek-llm-7b-chat"
"""What verl loads when ``actor_rollout_ref.model.path`` is not set (its ppo_trainer.yaml default, 0.2 to 0.9.1)."""


def model_for(cfg: Any, explicit: str | None = None) -> ModelShape:
    """The shape to price: ``explicit`` (``--model`` / the dashboard's choice: a name or a folder with a config.json)
    when given, else the model ``actor_rollout_ref.model.path`` names, else (the path not set) verl's own default,
    DeepSeek-LLM-7B, which ``default_model_note`` says first. ConfigError otherwise, one line."""
    if explicit:
        return resolve(explicit, "--model")
    if not cfg.is_set(PATH_KEY):
        return resolve(VERL_DEFAULT_PATH)
    return resolve(str(cfg.get(PATH_KEY) or ""))


def default_model_note(cfg: Any, explicit: str | None) -> str | None:
    """The line an answer opens with when no model is named anywhere: it prices what verl would load."""
    if explicit or cfg.is_set(PATH_KEY):
        return None
    return (
        f"note: {PATH_KEY} is not set: verl loads its default {VERL_DEFAULT_PATH}, priced as "
        f"{resolve(VERL_DEFAULT_PATH).name}; set {PATH_KEY} or pass --model to price your model"
    )


def _billions(s: ModelShape) -> str:
    total = f"{s.param_count() / 1e9:.3g}B"
    return f"{total} total, {s.active_param_count() / 1e9:.3g}B active" if s.is_moe else f"{total} params"


def stand_in_note(cfg: Any, explicit: str | None) -> str | None:
    """When ``--model`` prices another model than ``actor_rollout_ref.model.path`` names, the line that says so
    first (issue 38 item 6), e.g. ``note: pricing Qwen3-8B (8.19B params) while actor_rollout_ref.model.path names
    Qwen3-30B-A3B (30.5B total, 3.35B active)``; None when they agree, no --model was given or the path is not set."""
    if not explicit or not cfg.is_set(PATH_KEY):
        return None
    chosen = resolve(explicit, "--model")
    path = str(cfg.get(PATH_KEY) or "")
    try:
        named: ModelShape | None = resolve(path) if path else None
    except ConfigError:
        named = None
    if named is not None and named.name == chosen.name:
        return None
    what = f"{named.name} ({_billions(named)})" if named is not None else f"{path!r}, a model labkit does not know"
    return f"note: pricing {chosen.name} ({_billions(chosen)}) while {PATH_KEY} names {what}"


def check_shape(cfg: Any) -> dict[str, int]:
    """The model numbers verl's and megatron-core's model checks read (heads, KV heads, layers, experts, vocabulary)
    and the HF model type with its non-attention sequence mixers (S10): the keyword arguments of
    ``labkit.validate.report.check``, when ``model.path`` names a model labkit knows; {} otherwise: those checks are
    then skipped, never run against a model the user does not train."""
    if not cfg.is_set(PATH_KEY):
        return {}
    try:
        m = model_for(cfg)
    except ConfigError:
        return {}
    return {
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_key_value_heads,
        "num_layers": m.num_hidden_layers,
        "num_experts": m.moe.num_experts if m.is_moe else 0,
        "vocab_size": m.vocab_size,
        "model_type": m.architecture,
        "sequence_mixers": tuple(
            sorted({t for t in m.layer_types if t == "linear_attention"} | ({"mamba"} if m.mamba else set()))
        ),
    }
