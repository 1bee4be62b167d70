"""One record type for "what rank r holds at stage s", and one container for a whole training step.

The planner (``labkit.plan.step``) fills a ``StepTrace`` from arithmetic; a live run fills one from what each rank
really saw. ``compare`` and the plotting functions serve both, so prediction and observation line up by design.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

# Canonical stage ids, in the order of verl's RayPPOTrainer.fit (docs/pipeline.md).
STAGES = (
    "dataloader",
    "repeat",
    "agent_loop",
    "generate",
    "balance",
    "reward",
    "old_log_prob",
    "ref_log_prob",
    "values",
    "advantage",
    "update_critic",
    "update_actor",
)
V1_STAGES = (
    "dataloader",
    "agent_loop",
    "generate",
    "reward",
    "replay_buffer",
    "padding",
    "balance",
    "old_log_prob",
    "ref_log_prob",
    "values",
    "advantage",
    "update_critic",
    "update_actor",
)
"""Stage order of verl 0.9.1's v1 loop (``trainer.use_v1=true``): no repeat; replay buffer and padding added."""


@dataclass
class MicroBatchRecord:
    """One micro-batch on one rank: rows, real tokens, tokens through the forward, KK workload."""

    rows: int
    tokens: int | None = None
    padded_tokens: int | None = None
    workload: float | None = None
    indices: list[int] | None = None


@dataclass
class RankRecord:
    """What one rank holds at one stage (rows, tokens, micro-batches, collectives)."""

    stage: str
    rank: int
    dp_rank: int | None = None
    tp_rank: int | None = None
    sp_rank: int | None = None
    rows: int = 0
    tokens: int | None = None
    padded_tokens: int | None = None
    workload: float | None = None
    micro_batches: list[MicroBatchRecord] = field(default_factory=list)
    mini_batches: list[int] = field(default_factory=list)
    collectives: dict[str, int] = field(default_factory=dict)
    bytes_predicted: int | None = None
    bytes_measured: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_micro(self) -> int:
        return len(self.micro_batches)


@dataclass
class StageRecord:
    """A stage's global view: how many rows exist, in which unit, and the rule that produced them."""

    name: str
    title: str
    global_rows: int
    unit: str = "samples"
    per_rank_rows: int | None = None
    formula: str = ""
    keys: list[str] = field(default_factory=list)
    where: str = ""
    note: str = ""


@dataclass
class StepTrace:
    """A whole training step: stage rows plus per-rank records; ``source`` is "plan" or "live"."""

    profile: str
    source: str = "plan"
    stages: list[StageRecord] = field(default_factory=list)
    ranks: list[RankRecord] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    row_lengths: list[int] | None = field(default=None, compare=False, repr=False)
    """The planner's rows' lengths by row id (the ids in ``MicroBatch.indices``: v1's completion order and padding
    rows included); kept out of ``to_dict``."""

    def stage(self, name: str) -> StageRecord:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"stage {name!r} not in this trace (has {[s.name for s in self.stages]})")

    def at(self, stage: str) -> list[RankRecord]:
        """Rank records of one stage, sorted by global rank."""
        return sorted((r for r in self.ranks if r.stage == stage), key=lambda r: r.rank)

    def stage_names(self) -> list[str]:
        return [s.name for s in self.stages]

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("row_lengths")
        return out

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict) -> StepTrace:
        ranks = []
        for r in d.get("ranks", []):
            r = dict(r)
            r["micro_batches"] = [MicroBatchRecord(**m) for m in r.get("micro_batches", [])]
            ranks.append(RankRecord(**r))
        stages = [StageRecord(**s) for s in d.get("stages", [])]
        return cls(d["profile"], d.get("source", "plan"), stages, ranks, dict(d.get("summary", {})))


@dataclass
class Mismatch:
    """One disagreement between a prediction and an observation."""

    stage: str
    rank: int
    field: str
    predicted: Any
    observed: Any

    def __str__(self) -> str:
        return f"{self.stage} rank {self.rank}: {self.field} predicted {self.predicted}, observed {self.observed}"


COUNT_FIELDS = (
    "rows",
    "tokens",
    "padded_tokens",
    "n_micro",
    "micro_rows",
    "micro_tokens",
    "mini_batches",
    "collectives",
)


def _field(r: RankRecord, name: str) -> Any:
    if name == "n_micro":
        return r.n_micro
    if name == "micro_rows":
        return [m.rows for m in r.micro_batches]
    if name == "micro_tokens":
        return [m.tokens for m in r.micro_batches]
    return getattr(r, name)


def compare(
    predicted: StepTrace,
    observed: StepTrace,
    stages: Iterable[str] | None = None,
    fields: Iterable[str] = ("rows", "tokens", "n_micro", "micro_rows", "micro_tokens"),
) -> list[Mismatch]:
    """Exact comparison of counts, stage by stage and rank by rank; a field observed as None is not compared."""
    names = list(stages) if stages is not None else [s for s in observed.stage_names() if s in predicted.stage_names()]
    out: list[Mismatch] = []
    for stage in names:
        pred = {r.rank: r for r in predicted.at(stage)}
        obs = {r.rank: r for r in observed.at(stage)}
        for rank in sorted(set(pred) | set(obs)):
            if rank not in pred or rank not in obs:
                out.append(Mismatch(stage, rank, "present", rank in pred, rank in obs))
                continue
            for f in fields:
                p, o = _field(pred[rank], f), _field(obs[rank], f)
                if o is None or (isinstance(o, list) and any(x is None for x in o)):
                    continue
                if p != o:
                    out.append(Mismatch(stage, rank, f, p, o))
    return out
