"""What step 1's rules hand each other: the DP sizes every worker call is dispatched over (``StepState``, with
worker init's normalised sizes) and one forward-only pass of a worker (``Pass``: its rows per rank, micro-batching
and token budget), so each rule reads its sizes instead of re-deriving them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepState:
    """Step 1's sizes, set by the data-parallel rule of ``first_step`` before any worker call is checked."""

    micro: dict = field(default_factory=dict)
    """Worker init's legacy normalised sizes (``Mp``, ``Mcp``, per-role micro sizes); empty for the engine."""
    D: int = 0
    """The trainer-facing DP size (W // sp; Megatron: W // (TP x PP x CP))."""
    sp: int = 1
    """What a token budget is multiplied by: the actor's Ulysses size (Megatron: CP)."""
    rows: int = 0
    """Rows per DP rank, B x n // D."""
    ref_dp: int = 0
    """The DP size of the ref's calls (the legacy fused worker and Megatron: D; the engine's FSDP ref: W // ref sp)."""
    ref_sp: int = 1
    """What the ref's token budget is multiplied by (its Ulysses size; Megatron: CP)."""


@dataclass(frozen=True)
class Pass:
    """One forward-only worker call (compute_log_prob, compute_ref_log_prob, compute_values) on one DP rank."""

    stage: str
    role: str
    rows: int
    dynamic: bool
    """The pass micro-batches by a token budget (``*use_dynamic_bsz``)."""
    budget_key: str
    budget: int
    sp: int
    micro_key: str
    micro: int | None
