"""The reality corpus (``data/reality/*.yaml``): public, cited cases of what real GPUs did with verl, read into
``Case`` records and checked field by field, so a malformed case is a one-line error naming its file and field.

The format is described in ``data/reality/README.md``. Nothing here knows what labkit predicts: the cases are the
runs as they happened; ``labkit.reality.score`` asks labkit about them.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

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
COUNTERS = ("process_peak_with_pool", "process_peak")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{2,100}$")
_URL = re.compile(r"^https://[A-Za-z0-9.-]+\.[a-z]{2,}/\S+$")
_OVERRIDE = re.compile(r"^(\+{1,2}|~)?[A-Za-z_][\w.@/-]*(=.*)?$", re.S)
_HYDRA_FLAG = re.compile(r"^--config-(path|name|dir)=\S+$")
_RELEASE = re.compile(r"^\d+\.\d+(\.\d+)?$")


class CorpusError(ValueError):
    """A case file that does not follow ``data/reality/README.md``."""


@dataclass(frozen=True)
class Assumption:
    """A value the source does not state: ``override`` is applied after the case's config (None: an unknown left
    unknown, recorded with why)."""

    override: str | None
    unknown: str | None
    why: str


@dataclass(frozen=True)
class Step:
    """One logged step: verl's ``perf/max_memory_*`` counters (GiB) and that step's lengths (tokens)."""

    step: int
    max_memory_allocated_gib: float | None
    max_memory_reserved_gib: float | None
    response_length_mean: float | None
    response_length_max: float | None
    prompt_length_mean: float | None
    prompt_length_max: float | None


@dataclass(frozen=True)
class Oom:
    """What the failure said: the phase, the message as quoted, and PyTorch's figures in GiB where given."""

    phase: str
    message: str
    tried_gib: float | None
    total_gib: float | None
    free_gib: float | None
    allocated_gib: float | None
    reserved_gib: float | None


@dataclass(frozen=True)
class Measured:
    """A log's memory figures: which reading verl's counter holds (``COUNTERS``), the engine's pool after it was
    built (GiB) where the log prints it, and the steps."""

    counter: str
    rollout_pool_gib: float | None
    steps: tuple[Step, ...]

    @property
    def peak_allocated_gib(self) -> float | None:
        """The largest ``max_memory_allocated`` of the logged steps (the counter never goes down)."""
        values = [s.max_memory_allocated_gib for s in self.steps if s.max_memory_allocated_gib is not None]
        return max(values) if values else None

    @property
    def longest_response(self) -> float | None:
        values = [s.response_length_max for s in self.steps if s.response_length_max is not None]
        return max(values) if values else None


@dataclass(frozen=True)
class Case:
    """One run that really happened, as its public source tells it."""

    id: str
    summary: str
    url: str
    source_kind: str
    date: str
    quote: str | None
    verl: str
    release_basis: str
    fork: str | None
    rollout_version: str | None
    gpu: str
    gpu_preset: str | None
    capacity_gib: float | None
    gpu_assumed: str | None
    """Why the GPU's capacity is assumed (the source does not say it), or None when it is stated."""
    nnodes: int
    n_gpus_per_node: int
    model: str
    strategy: str
    rollout: str
    config: tuple[str, ...]
    assumed: tuple[Assumption, ...]
    outcome: str
    oom: Oom | None
    measured: Measured | None
    fix: str | None
    lengths: str | None
    """The ``--lengths`` its user would pass (a profile or ``prompt=P,response=R``), where the source tells the
    lengths (``lengths_why``); a log's mean lengths are used when this is not set."""
    lengths_why: str | None
    confidence: str
    confidence_why: str
    notes: str | None
    path: Path

    @property
    def arguments(self) -> list[str]:
        """What the run passed to verl's entry point: its config, each item an assumed value replaces (the same key or
        flag, e.g. a shell variable the source leaves unresolved) dropped, then every assumed value."""
        sets = [a.override for a in self.assumed if a.override]
        replaced = {_name(s) for s in sets}
        return [*(item for item in self.config if _name(item) not in replaced), *sets]

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node

    @property
    def expected_lengths(self) -> tuple[str, str] | None:
        """``(--lengths value, why)``: the case's own, else the mean lengths of the logged step with the longest
        responses (what a user reading the log would pass), else None (full width)."""
        if self.lengths:
            return self.lengths, self.lengths_why or ""
        steps = [
            x for x in (self.measured.steps if self.measured else ()) if x.response_length_mean and x.prompt_length_mean
        ]
        if not steps:
            return None
        top = max(steps, key=lambda x: x.response_length_mean or 0)
        value = f"prompt={max(1, round(top.prompt_length_mean))},response={max(1, round(top.response_length_mean))}"
        return value, f"the mean prompt and response lengths of logged step {top.step}"


def _name(item: str) -> str:
    """The key (or Hydra flag) an argument sets: ``a.b`` of ``+a.b=1``, ``--config-name`` of ``--config-name=x``."""
    return item.split("=", 1)[0].lstrip("+~")


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
