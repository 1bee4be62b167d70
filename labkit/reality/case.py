"""The records of the reality corpus: one ``Case`` per public run (what it ran, on what, what it assumed, what the
GPU did, what the log measured), as ``labkit.reality.corpus`` reads them from ``data/reality/*.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

COUNTERS = ("process_peak_with_pool", "process_peak")
"""What a log's ``max_memory_allocated`` holds: the process's peak with the rollout's slept pool in it, or without."""


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
