"""The data/ tables the memory model reads (``data/model_shapes.json``, ``data/gpus.json``): each read once, and an
entry looked up by its name in any case (or, for models, by its Hugging Face repo id).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "data"


@cache
def data_table(file: str, key: str) -> dict[str, dict[str, Any]]:
    """``data/<file>``'s ``key`` table, read once."""
    with open(DATA / file) as f:
        return json.load(f)[key]


def lookup_entry(table: dict[str, dict[str, Any]], name: str, what: str, aliases: bool) -> tuple[str, dict[str, Any]]:
    """The key and entry ``name`` names (any case; ``aliases``: its source repo id or basename too); KeyError
    lists the known names."""
    wanted = name.strip().lower()
    for key, entry in table.items():
        names = {key.lower()}
        if aliases:
            names |= {entry["source"].lower(), entry["source"].rsplit("/", 1)[-1].lower()}
        if wanted in names:
            return key, entry
    raise KeyError(f"unknown {what} {name!r}; known: {', '.join(table)}")
