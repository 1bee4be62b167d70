"""docs/models.md: the model catalogue table, generated from ``data/model_shapes.json`` (tests check it matches)."""

from __future__ import annotations

import json

from labkit.memory.data_tables import DATA
from labkit.memory.model_catalogue import model_names, model_shape

HEAD = """# Models labkit knows

`labkit memory` and the dashboard price the model `actor_rollout_ref.model.path` names. This table is generated from
`data/model_shapes.json` (`labkit.memory.catalogue_doc.render`); each row's shapes were transcribed from the model's
Hugging Face `config.json` (kept verbatim in the entry's `config`), and the counts are labkit's, checked against the
published figure (tests/test_shapes.py) and against transformers' own modules built on the meta device.

## How a name is recognised

`labkit.memory.model_source.known_shape` matches, case-insensitively: the catalogue name (`Qwen3-30B-A3B`), the HF
repo id (`Qwen/Qwen3-30B-A3B`), its basename, a local folder ending in the name (`~/models/Qwen3-30B-A3B-Instruct-2507`,
`hdfs://x/Qwen2.5-7B-Instruct`), and variant suffixes of the same shape (`-Instruct`, `-Base`, `-Chat`, `-Thinking`,
`-it`, `-RL`, `-bf16`, `-mcore`, a 4-digit date such as `-2507`). Otherwise a local folder with a `config.json` of a
supported `model_type` is read for its shape (`--model PATH` passes one explicitly). Anything else is refused with the
three closest catalogued names. When `--model` prices another model than `model.path` names, the answer says so first.

Total counts every unique tensor (a tied LM head once, the vision tower included, MTP layers excluded). Active (MoE)
is what one token runs through: all dense parts, the router, the shared experts and top-k routed experts.

| model | family | total | active | source |
|---|---|---|---|---|
"""


def render() -> str:
    """The whole docs/models.md."""
    table = json.loads((DATA / "model_shapes.json").read_text())["models"]
    rows = []
    for name in model_names():
        s = model_shape(name)
        active = f"{s.active_param_count() / 1e9:.2f}B" if s.is_moe else ""
        vision = " (+vision)" if s.vision is not None else ""
        rows.append(
            f"| {name} | {table[name].get('family', '')}{vision} | {s.param_count() / 1e9:.2f}B | {active} | "
            f"`{s.source}` |"
        )
    return HEAD + "\n".join(rows) + "\n"
