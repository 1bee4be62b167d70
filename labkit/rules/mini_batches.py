"""The mini-batch rules of an update, written once: the legacy worker's normalisation with its E20–E22 asserts,
and the engine's E28/E29. The planner raises the failure as a ``StageFailure``, the live actor as verl's
``AssertionError``; ``labkit.validate`` records each check with the same codes and texts.
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.rules.failures import StageFailure
from labkit.rules.geometry import legacy_normalized_mini


def legacy_mini(
    mini_batch_size: int, rollout_n: int, world_size: int, sp: int, micro: int | None, actor: bool = True
) -> int:
    """M′ = (M·n)//(W//sp) after the legacy worker's asserts, in verl's order: E20 (actor only), the division by a
    micro size floored to 0 (X1), E21, E22. Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker.__init__
    and CriticWorker.__init__ (≤ 0.7). Raises StageFailure."""
    mini = legacy_normalized_mini(mini_batch_size, rollout_n, world_size, sp)
    if actor and not mini > 0:
        raise StageFailure("E20", "AssertionError", message("E20", mini=mini))
    if micro is None:
        return mini
    if micro == 0:
        raise StageFailure("X1", "ZeroDivisionError", "integer modulo by zero")
    if mini % micro != 0:
        raise StageFailure("E21", "AssertionError", message("E21", mini=mini, micro=micro))
    if not mini // micro > 0:
        raise StageFailure("E22", "AssertionError", message("E22", mini=mini, micro=micro))
    return mini


def engine_mini(mini_batch_size: int, rollout_n: int, dp_size: int, rows: int | None = None) -> int:
    """Per-rank mini = (M·n)/D with E28, then E29 when the rank's ``rows`` are not whole mini-batches.
    Mirrors verl/workers/engine_workers.py: TrainingWorker.train_mini_batch and its mini-batch iterator."""
    total = mini_batch_size * rollout_n
    if total % dp_size != 0:
        raise StageFailure("E28", "AssertionError", message("E28", mini_batch_size=total, dp_size=dp_size))
    mini = total // dp_size
    if rows is not None and rows % mini != 0:
        raise StageFailure("E29", "AssertionError", message("E29", rows=rows, mini=mini))
    return mini
