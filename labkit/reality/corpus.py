"""The reality corpus (``data/reality/*.yaml``): public, cited cases of what real GPUs did with verl, read into
``Case`` records and checked field by field, so a malformed case is a one-line error naming its file and field.

The format is described in ``data/reality/README.md``. Nothing here knows what labkit predicts: the cases are the
runs as they happened; ``labkit.reality.score`` asks labkit about them.
"""

from __future__ import annotations

import datetime
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from labkit.reality.case import COUNTERS, Assumption, Case, Measured, Oom, Step

CORPUS_DIR = Path(__file__).resolve().parents[2] / "data" / "reality"
OUTCOMES = ("oom", "ran")
PHASES = (
    "startup",
    "generate",
    "old_log_prob",
    "ref_log_prob",
    "values",
    "update_actor",
    "update_critic",
    "unknown",
)
CONFIDENCES = ("high", "medium", "low")
KINDS = ("issue", "pull", "discussion", "doc", "script", "log", "readme", "blog")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{2,100}$")
_URL = re.compile(r"^https://[A-Za-z0-9.-]+\.[a-z]{2,}/\S+$")
_OVERRIDE = re.compile(r"^(\+{1,2}|~)?[A-Za-z_][\w.@/-]*(=.*)?$", re.S)
_HYDRA_FLAG = re.compile(r"^--config-(path|name|dir)=\S+$")
_RELEASE = re.compile(r"^\d+\.\d+(\.\d+)?$")


class CorpusError(ValueError):
    """A case file that does not follow ``data/reality/README.md``."""


def _field(doc: dict, path: str, kind: type | tuple, where: str, required: bool = True) -> Any:
    node: Any = doc
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        if required:
            raise CorpusError(f"{where}: '{path}' is missing")
        return None
    if isinstance(kind, tuple) and all(isinstance(k, str) for k in kind):
        if node not in kind:
            raise CorpusError(f"{where}: '{path}' is {node!r}; expected one of {', '.join(kind)}")
        return node
    if kind is float and isinstance(node, int) and not isinstance(node, bool):
        return float(node)
    if not isinstance(node, kind) or isinstance(node, bool) and kind is not bool:
        raise CorpusError(f"{where}: '{path}' is {node!r}; expected {getattr(kind, '__name__', kind)}")
    return node


def _number(node: Any, name: str, where: str) -> float | None:
    if node is None:
        return None
    if isinstance(node, bool) or not isinstance(node, (int, float)) or node < 0:
        raise CorpusError(f"{where}: '{name}' is {node!r}; expected a non-negative number or null")
    return float(node)


def _assumptions(items: Any, where: str) -> tuple[Assumption, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise CorpusError(f"{where}: 'assumed' must be a list")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("why"), str) or not item["why"].strip():
            raise CorpusError(f"{where}: assumed[{i}] needs a 'why'")
        override, unknown = item.get("set"), item.get("unknown")
        if (override is None) == (unknown is None):
            raise CorpusError(f"{where}: assumed[{i}] has one of 'set' (an override) or 'unknown' (what stays unknown)")
        if override is not None and not (
            isinstance(override, str) and (_OVERRIDE.match(override) or _HYDRA_FLAG.match(override))
        ):
            raise CorpusError(f"{where}: assumed[{i}].set {override!r} is not a Hydra override key=value")
        out.append(Assumption(override, unknown, item["why"].strip()))
    return tuple(out)


def _oom(doc: Any, where: str) -> Oom:
    if not isinstance(doc, dict):
        raise CorpusError(f"{where}: outcome oom needs an 'oom' mapping")
    figures = {k: _number(doc.get(k), f"oom.{k}", where) for k in Oom.__dataclass_fields__ if k.endswith("_gib")}
    return Oom(phase=_field(doc, "phase", PHASES, where), message=str(doc.get("message") or "").strip(), **figures)


def _measured(doc: Any, where: str) -> Measured | None:
    if doc is None:
        return None
    steps = []
    for i, s in enumerate(_field(doc, "steps", list, where)):
        if not isinstance(s, dict) or not isinstance(s.get("step"), int):
            raise CorpusError(f"{where}: measured.steps[{i}] needs an integer 'step'")
        values = {k: _number(s.get(k), f"steps[{i}].{k}", where) for k in Step.__dataclass_fields__ if k != "step"}
        steps.append(Step(step=s["step"], **values))
    return Measured(
        counter=_field(doc, "counter", COUNTERS, where),
        rollout_pool_gib=_number(doc.get("rollout_pool_gib"), "measured.rollout_pool_gib", where),
        steps=tuple(steps),
    )


def parse_case(doc: Any, path: Path) -> Case:
    """One case from its YAML document; CorpusError naming the file and the field for anything malformed."""
    where = path.name
    if not isinstance(doc, dict):
        raise CorpusError(f"{where}: expected a mapping")
    case_id = _field(doc, "id", str, where)
    if not _ID.match(case_id) or path.stem != case_id:
        raise CorpusError(f"{where}: id {case_id!r} must be lowercase [a-z0-9-] and equal the file name")
    url = _field(doc, "source.url", str, where)
    if not _URL.match(url):
        raise CorpusError(f"{where}: source.url {url!r} is not an https address")
    verl = str(_field(doc, "release.verl", (str, float), where))
    if not _RELEASE.match(verl):
        raise CorpusError(f"{where}: release.verl {verl!r} is not a release such as 0.3 or 0.9.1")
    config = _field(doc, "config", list, where)
    for item in config:
        if not isinstance(item, str) or not (_OVERRIDE.match(item) or _HYDRA_FLAG.match(item)):
            raise CorpusError(f"{where}: config item {item!r} is neither a Hydra override nor --config-name/path")
    outcome = _field(doc, "outcome", OUTCOMES, where)
    nodes, per_node = _field(doc, "hardware.nnodes", int, where), _field(doc, "hardware.n_gpus_per_node", int, where)
    if nodes < 1 or per_node < 1:
        raise CorpusError(f"{where}: hardware.nnodes and n_gpus_per_node must be at least 1")
    capacity = _number(doc["hardware"].get("capacity_gib"), "hardware.capacity_gib", where)
    preset = doc["hardware"].get("preset")
    if capacity is None and preset is None:
        raise CorpusError(f"{where}: hardware needs a labkit GPU 'preset' or the 'capacity_gib' torch reported")
    return Case(
        id=case_id,
        summary=" ".join(_field(doc, "summary", str, where).split()),
        url=url,
        source_kind=_field(doc, "source.kind", KINDS, where),
        date=str(_field(doc, "source.date", (str, int, datetime.date), where)),
        quote=(doc["source"].get("quote") or None),
        verl=verl,
        release_basis=_field(doc, "release.basis", str, where),
        fork=doc["release"].get("fork"),
        rollout_version=doc["release"].get("rollout_version"),
        gpu=_field(doc, "hardware.gpu", str, where),
        gpu_preset=preset,
        capacity_gib=capacity,
        gpu_assumed=doc["hardware"].get("assumed"),
        nnodes=nodes,
        n_gpus_per_node=per_node,
        model=_field(doc, "model", str, where),
        strategy=_field(doc, "strategy", ("fsdp", "megatron"), where),
        rollout=_field(doc, "rollout", ("vllm", "sglang", "hf"), where),
        config=tuple(config),
        assumed=_assumptions(doc.get("assumed"), where),
        outcome=outcome,
        oom=_oom(doc.get("oom"), where) if outcome == "oom" else None,
        measured=_measured(doc.get("measured"), where),
        fix=doc.get("fix"),
        lengths=(doc.get("lengths") or {}).get("set"),
        lengths_why=(doc.get("lengths") or {}).get("why"),
        confidence=_field(doc, "confidence", CONFIDENCES, where),
        confidence_why=" ".join(_field(doc, "confidence_why", str, where).split()),
        notes=doc.get("notes"),
        path=path,
    )


@cache
def load_corpus(folder: Path = CORPUS_DIR) -> tuple[Case, ...]:
    """Every case of the corpus, sorted by id (CorpusError on the first malformed one)."""
    cases = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise CorpusError(f"{path.name}: malformed YAML: {str(exc).splitlines()[0]}") from None
        cases.append(parse_case(doc, path))
    return tuple(cases)


def case(case_id: str) -> Case:
    """The case ``case_id`` (KeyError naming the known ids when there is none)."""
    for c in load_corpus():
        if c.id == case_id:
            return c
    raise KeyError(f"no case {case_id!r} in the corpus; known: {', '.join(c.id for c in load_corpus())}")
