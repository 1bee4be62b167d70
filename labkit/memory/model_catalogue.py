"""The model catalogue: ``data/model_shapes.json``'s entries as ``ModelShape``s, by name, repo id or basename.

Most entries keep their ``config.json`` keys verbatim and are read by ``labkit.memory.shapes_hf.shape_fields`` (the
parser a local checkpoint folder uses too); the first 18 give ModelShape's fields flat.
"""

from __future__ import annotations

from dataclasses import fields
from functools import cache
from typing import Any

from labkit.memory.data_tables import data_table, lookup_entry
from labkit.memory.shapes import ModelShape
from labkit.memory.shapes_hf import TEXT_TYPES, shape_fields

ARCHITECTURES = tuple(sorted(TEXT_TYPES - {"gemma3"} | {"gemma3_text"}))
"""The ``architecture`` values a ModelShape can have (HF model_types; Gemma 3 VL reads as ``gemma3_text``)."""


def model_names() -> list[str]:
    """The models in ``data/model_shapes.json``, in file order."""
    return list(data_table("model_shapes.json", "models"))


def shape_from_entry(key: str, entry: dict[str, Any]) -> ModelShape:
    """A catalogue entry as a ModelShape: its verbatim ``config`` (config.json keys) read by
    ``labkit.memory.shapes_hf.shape_fields``, or the flat fields of the first 18 entries."""
    meta = dict(
        published_params=int(entry.get("published_params") or 0),
        source=str(entry.get("source", key)),
        family=str(entry.get("family", "")),
        published_active_params=int(entry.get("published_active_params") or 0),
    )
    if "config" in entry:
        return ModelShape(name=key, **shape_fields(entry["config"]), **meta)
    names = {f.name for f in fields(ModelShape)} - {"name", *meta}
    return ModelShape(name=key, **{k: v for k, v in entry.items() if k in names}, **meta)


@cache
def model_shape(name: str) -> ModelShape:
    """The shape of ``name``: a key, its HF repo id or the repo's basename, any case. KeyError lists the known names."""
    key, entry = lookup_entry(data_table("model_shapes.json", "models"), name, "model", aliases=True)
    return shape_from_entry(key, entry)
