"""What micro-batching on one DP rank produces and how it speaks to its DP group: the plan of a rank
(``MicroBatchPlan``: row indices, tokens and KK workload per micro-batch, in execution order), the ``dp_sync``
callable a live rank answers with a real all_reduce, and the steps a rank's plan yields (``labkit.balance.lockstep``
answers them for every rank at once). Mirrors the return value of verl/utils/seqlen_balancing.py:
rearrange_micro_batches.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

# dp_sync(op, values) -> values all-reduced over the DP group; op is "max" or "min" (verl: dist.all_reduce).
DpSync = Callable[[str, list[int]], list[int]]
# A rank's plan yields ("max"|"min", values) for each DP all-reduce and ("kk", (workloads, k)) for each KK partition.
SyncSteps = Generator[tuple[str, Any], Any, "MicroBatchPlan"]


@dataclass
class MicroBatchPlan:
    """Micro-batches of one rank in execution order: row indices, real tokens and KK workload of each."""

    indices: list[list[int]]
    tokens: list[int]
    workloads: list[int]
    profile: str
    attempts: int = 1  # KK runs (engine: the count grows until every bucket fits the budget)
    syncs: list[str] = field(default_factory=list)  # DP all-reduces issued, in order ("max", "max", "min", ...)

    @property
    def num_micro_batches(self) -> int:
        return len(self.indices)
