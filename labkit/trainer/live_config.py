"""What a live run reads from its config: the live rollout's small CPU defaults (``rollout_config``: 8 prompts, n=4,
4 GPUs, TP 1, an fp32 eager engine), the batch geometry and verl's sampling keys (``sizes``). Used by
``labkit.trainer.live_rollout`` and ``labkit.trainer.grpo_trainer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from labkit.config.verl_config import VerlConfig, load_config
from labkit.rules.geometry import ARR, BatchGeometry
from labkit.rules.run import as_run

DEFAULT_OVERRIDES = (
    "data.train_batch_size=8",
    f"{ARR}.rollout.n=4",
    "trainer.n_gpus_per_node=4",
    f"{ARR}.rollout.tensor_model_parallel_size=1",
    "data.max_prompt_length=24",
    "data.max_response_length=32",
    f"{ARR}.rollout.dtype=float32",  # the fp32 tiny model, like labkit's actor
    f"{ARR}.rollout.enforce_eager=true",  # no inductor compile of the engine on a CPU
)


def rollout_config(cfg: VerlConfig | Sequence[str] | None = None, profile: str = "engine") -> VerlConfig:
    """A VerlConfig as is, or small CPU defaults (8 prompts, n=4, 4 GPUs, TP 1, 24+32 tokens, an fp32 eager engine)
    plus overrides.
    Engine defaults say ``trainer.use_v1=false``: the live rollout's per-rank partition is the v0 loop's dispatch."""
    if isinstance(cfg, VerlConfig):
        return cfg
    loop = ["trainer.use_v1=false"] if profile == "engine" else []
    return load_config(overrides=[*DEFAULT_OVERRIDES, *loop, *(cfg or [])], profile=profile)


@dataclass(frozen=True)
class RolloutSizes:
    """What the live rollout reads from a config: the batch geometry and verl's sampling keys."""

    geo: BatchGeometry
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    engine: str = "vllm"

    def as_dict(self) -> dict[str, Any]:
        """Flat, for a trace summary."""
        return {**asdict(self.geo), **{k: v for k, v in asdict(self).items() if k != "geo"}}


def sizes(cfg: VerlConfig) -> RolloutSizes:
    """The geometry and sampling settings of the live rollout (``rollout.do_sample``, temperature, top_k, top_p)
    and the engine (``rollout.name``)."""
    g = cfg.get
    return RolloutSizes(
        as_run(cfg).geometry,
        bool(g(f"{ARR}.rollout.do_sample")),
        g(f"{ARR}.rollout.temperature"),
        g(f"{ARR}.rollout.top_k"),
        g(f"{ARR}.rollout.top_p"),
        g(f"{ARR}.rollout.name"),
    )
