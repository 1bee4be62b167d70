"""Whether, and over which group, dynamic micro-batching syncs its micro-batch count across DP ranks.

verl's ``rearrange_micro_batches`` all-reduces the count with MAX so every rank runs the same number of forwards
(and FSDP collectives). The guard around that all-reduce changed between versions, and the callers pass different
groups: this is the rule, once, for the planner's notes and the claim checks.
"""

from __future__ import annotations

PROFILES = ("legacy", "engine")


def sync_group(
    profile: str, dp_group_given: bool, dist_initialized: bool = True, same_micro_num_in_dp: bool = True
) -> str | None:
    """``"dp"`` (the DP group passed in), ``"world"`` (legacy, verl 0.8.0.dev: the guard has no ``dp_group`` term, so
    ``dp_group=None``, what ``dp_actor`` passes, means the default group) or None (no sync: the 0.9.1 guard, like
    0.7.1's, also requires a ``dp_group``; 0.7.1's ``dp_actor`` passes none, the hang of verl issue #5750).
    Mirrors ``dist.is_initialized() and same_micro_num_in_dp [and dp_group is not None]`` in
    verl/utils/seqlen_balancing.py: rearrange_micro_batches."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    if not (dist_initialized and same_micro_num_in_dp):
        return None
    if dp_group_given:
        return "dp"
    return "world" if profile == "legacy" else None


def dp_group_passed(profile: str) -> bool:
    """Whether verl's caller hands ``rearrange_micro_batches`` a DP group: the engine's ``prepare_micro_batches``
    does, the legacy ``dp_actor`` does not (verl/workers/actor/dp_actor.py, verl/workers/engine/utils.py)."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    return profile == "engine"
