"""One rollout interface, two engines, chosen by ``actor_rollout_ref.rollout.name``: ``vllm`` (verl's default
choice, ``labkit.rl.vllm_engine``) or ``hf`` (HF generate on TP shards, ``labkit.rl.hf_engine``).

An engine lives in one rollout rank and has four calls: ``start()`` (load; returns what it got), ``generate(prompts,
response_length)`` (verl's rollout tensors and the rank's metrics), ``update_weights(full)`` (the actor's full
weights, after each update) and ``shutdown()``. Where vLLM is not installed, ``vllm`` runs on the HF engine after a
one-line notice on the driver. Mirrors verl/workers/rollout/base.py: BaseRollout and get_rollout_class.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Protocol

import torch

from labkit.protocol.data_proto import DataProto

NAMES = ("vllm", "hf")
_NOTICED: set[str] = set()


class RolloutEngine(Protocol):
    """What the rollout worker asks of an engine."""

    name: str

    def start(self) -> dict[str, Any]: ...

    def generate(self, prompts: DataProto, response_length: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]: ...

    def update_weights(self, full: dict[str, torch.Tensor]) -> dict[str, Any]: ...

    def shutdown(self) -> dict[str, Any]: ...


def vllm_available() -> bool:
    """True when the ``vllm`` package can be imported here (found on the path; importing it costs seconds)."""
    return importlib.util.find_spec("vllm") is not None


def resolve(name: str) -> str:
    """The engine that will run for rollout.name ``name``: ``vllm`` falls back to ``hf`` where vLLM is not
    installed, saying so once on stderr."""
    if name not in NAMES:
        raise ValueError(f"actor_rollout_ref.rollout.name must be one of {list(NAMES)}, got {name!r}")
    if name == "vllm" and not vllm_available():
        if "vllm" not in _NOTICED:
            _NOTICED.add("vllm")
            print(
                "labkit: vllm is not installed here; the rollout runs on the HF engine (rollout.name=hf)",
                file=sys.stderr,
            )
        return "hf"
    return name
