"""Which families of knobs "why did it OOM?" tries, per training engine (``labkit.memory.fix_candidates`` and
``labkit.memory.fix_scale`` define them)."""

from __future__ import annotations

from labkit.config.verl_config import VerlConfig
from labkit.memory.fix_candidates import (
    Candidate,
    CandidateSource,
    checkpointing,
    log_prob_head,
    megatron_recompute_and_offload,
    megatron_sizes,
    micro_rows,
    offload,
    rollout_pool,
    token_budget,
    ulysses,
)
from labkit.memory.fix_scale import lora, megatron_cpu_optimizer, more_nodes, rollout_tp
from labkit.memory.settings import MemorySettings
from labkit.rules.parallel_layout import MEGATRON, engine_of

CANDIDATES: list[CandidateSource] = [
    micro_rows,
    token_budget,
    ulysses,
    log_prob_head,
    checkpointing,
    offload,
    rollout_pool,
    rollout_tp,
    lora,
    more_nodes,
]
"""Every family of knobs under FSDP, in the order their fixes are listed before sorting (append one to add one)."""

MEGATRON_CANDIDATES: list[CandidateSource] = [
    micro_rows,
    token_budget,
    megatron_sizes,
    megatron_recompute_and_offload,
    megatron_cpu_optimizer,
    rollout_pool,
    rollout_tp,
    more_nodes,
]
"""Under Megatron: the shared batch knobs, its own sizes, recompute and offloads (FSDP's Ulysses, checkpointing,
offload, head and LoRA knobs are not read by the Megatron engine)."""


def candidates(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """Every knob worth trying for one phase that does not fit (the training engine's own)."""
    megatron = engine_of(cfg) == MEGATRON
    return [c for source in (MEGATRON_CANDIDATES if megatron else CANDIDATES) for c in source(cfg, s, phase)]
