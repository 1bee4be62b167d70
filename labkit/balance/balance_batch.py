"""Sequence balancing: the Karmarkar-Karp partitioner and the trainer's `_balance_batch` across DP ranks.

Mirrors verl/utils/seqlen_balancing.py (karmarkar_karp, greedy_partition, get_seqlen_balanced_partitions,
get_group_balanced_partitions, log_seqlen_unbalance) and verl/trainer/ppo/ray_trainer.py: RayPPOTrainer._balance_batch.
The partitioner itself lives in `labkit.balance.kk`; this module holds what verl builds on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from labkit.balance.kk import NUMPY_MIN_K, as_values, karmarkar_karp, kk_equal_np
from labkit.rules.geometry import workload


def calculate_workload(seqlens: Any) -> Any:
    """24576·L + L² per sequence; arrays/tensors keep their dtype, lists give ints. Mirrors calculate_workload."""
    if isinstance(seqlens, (list, tuple)):
        return [workload(s) for s in seqlens]
    return workload(seqlens)


def greedy_partition(seqlen_list: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Assign items in input order to the lightest partition (bias sum+1 per item if equal_size).

    Mirrors seqlen_balancing.greedy_partition (no caller in verl)."""
    values = as_values(seqlen_list)
    bias = sum(values) + 1 if equal_size else 0
    partitions: list[list[int]] = [[] for _ in range(k_partitions)]
    sums = [0] * max(k_partitions, 0)
    for i, v in enumerate(values):
        if not sums:
            raise TypeError("list indices must be integers or slices, not NoneType")
        j = min(range(len(sums)), key=sums.__getitem__)  # first lightest, like verl's strict '<' scan
        partitions[j].append(i)
        sums[j] += v + bias
    if equal_size:
        for part in partitions:
            assert len(part) * k_partitions == len(values), f"{len(part)} * {k_partitions} != {len(values)}"
    return partitions


def get_seqlen_balanced_partitions(seqlen_list: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """KK partitions with verl's checks (E36, E38, E37), indices sorted inside each.

    Mirrors seqlen_balancing.get_seqlen_balanced_partitions."""
    n = len(seqlen_list)
    assert n >= k_partitions, f"number of items:[{n}] < k_partitions:[{k_partitions}]"
    partitions = karmarkar_karp(seqlen_list, k_partitions, equal_size)
    assert len(partitions) == k_partitions, f"{len(partitions)} != {k_partitions}"
    for i, part in enumerate(partitions):
        assert len(part) > 0, f"the {i}-th partition is empty"
    assert set(chain.from_iterable(partitions)) == set(range(n))
    return [sorted(part) for part in partitions]


def get_group_balanced_partitions(seqlen_list: Sequence[int], uid_list: Sequence, k_partitions: int) -> list[list[int]]:
    """Equal-size KK over runs of equal uid (PrefixGrouper), runs kept whole. Mirrors get_group_balanced_partitions."""
    assert len(seqlen_list) == len(uid_list), "seqlen_list and uid_list must have same length"
    groups: list[list[int]] = []  # runs of consecutive equal uids (verl assumes a uid's rows are contiguous)
    current = None
    for i, uid in enumerate(uid_list):
        if groups and uid == current:
            groups[-1].append(i)
        else:
            groups.append([i])
            current = uid
    assert len(groups) >= k_partitions, (
        f"Number of uid groups ({len(groups)}) must be >= k_partitions ({k_partitions}). "
        f"Consider reducing world_size or increasing batch_size."
    )
    lens = as_values(seqlen_list)
    group_workloads = [sum(workload(int(lens[i])) for i in g) for g in groups]
    parts = get_seqlen_balanced_partitions(group_workloads, k_partitions, equal_size=True)
    return [sorted(i for g in part for i in groups[g]) for part in parts]


def log_seqlen_unbalance(seqlen_list: Sequence[int], partitions: list[list[int]], prefix: str) -> dict[str, Any]:
    """Token sums of contiguous chunks (no balancing) vs of the partitions, under verl's metric names.

    Mirrors seqlen_balancing.log_seqlen_unbalance."""
    lens = as_values(seqlen_list)
    chunk = len(lens) // len(partitions)
    chunk_sums = [sum(lens[off : off + chunk]) for off in range(0, len(lens), chunk)]
    balanced = [sum(map(lens.__getitem__, part)) for part in partitions]
    return {
        f"{prefix}/min": min(chunk_sums),
        f"{prefix}/max": max(chunk_sums),
        f"{prefix}/minmax_diff": max(chunk_sums) - min(chunk_sums),
        f"{prefix}/balanced_min": min(balanced),
        f"{prefix}/balanced_max": max(balanced),
        f"{prefix}/mean": sum(chunk_sums) / len(partitions),
    }


def _numpy_path(lens: list[int], dp_size: int) -> bool:
    """Whether the default path can run on int64 rows: many ranks, equal counts, workload sums far from overflow."""
    n = len(lens)
    if dp_size < NUMPY_MIN_K or n < dp_size or n % dp_size or min(lens) < 0:
        return False
    top = max(lens)
    return n * workload(top) < 2**62


def _balanced_order_np(workloads: list[int], dp_size: int) -> np.ndarray:
    """(dp_size, rows) row order of the default _balance_batch path: equal-size KK partitions (indices ascending, as
    get_seqlen_balanced_partitions returns them), each then ordered small-large-small by (workload, index)."""
    w = np.asarray(workloads, dtype=np.int64)
    parts = np.sort(kk_equal_np(w, dp_size, as_array=True), axis=1)
    by_load = np.take_along_axis(parts, np.lexsort((parts, w[parts]), axis=-1), axis=1)
    return np.concatenate([by_load[:, ::2], by_load[:, 1::2][:, ::-1]], axis=1)


def v1_partitions(seqlens: Sequence[int], dp_size: int) -> list[list[int]]:
    """Rows per DP rank of the v1 loop's ``_balance_batch``: equal-size KK over the workloads, each partition in
    ascending batch index (no small-large-small re-sort). Mirrors verl/trainer/ppo/v1/trainer_base.py:
    PPOTrainer._balance_batch (get_seqlen_balanced_partitions on the padded batch)."""
    lens = [int(s) for s in seqlens]
    workloads = calculate_workload(lens)
    if _numpy_path(lens, dp_size):
        return np.sort(kk_equal_np(np.asarray(workloads, dtype=np.int64), dp_size, as_array=True), axis=1).tolist()
    return get_seqlen_balanced_partitions(workloads, dp_size, equal_size=True)


@dataclass
class BalanceResult:
    """Outcome of `balance_batch`: the global reorder index, rank r's rows (`partitions[r]`), metrics, workloads."""

    global_idx: list[int]
    partitions: list[list[int]]
    metrics: dict[str, Any] = field(default_factory=dict)
    workloads: list[int] = field(default_factory=list)


def balance_batch(
    seqlens: Any,
    dp_size: int,
    *,
    keep_minibatch: bool = False,
    ppo_mini_batch_size: int | None = None,
    use_prefix_grouper: bool = False,
    uids: Sequence | None = None,
    logging_prefix: str = "global_seqlen",
) -> BalanceResult:
    """Reorder rows so each DP rank gets a balanced workload. Mirrors RayPPOTrainer._balance_batch.

    `seqlens` = attention_mask row sums; rank r receives `partitions[r]` (rows in small-large-small order) after the
    dispatcher cuts `global_idx` into equal consecutive chunks.
    """
    lens = [int(s) for s in as_values(seqlens)]
    workloads = calculate_workload(lens)
    if use_prefix_grouper and uids is not None:
        uid_list = list(uids)
        num_groups = len(set(uid_list))
        if num_groups % dp_size != 0:
            raise ValueError(
                f"PrefixGrouper with balance_batch requires num_uid_groups ({num_groups}) "
                f"% dp_size ({dp_size}) == 0. "
                f"This ensures each rank gets equal number of groups. "
                f"Current batch_size={len(lens)}, adjust batch_size to be a multiple of "
                f"dp_size * rollout.n."
            )
        partitions = get_group_balanced_partitions(lens, uid_list, dp_size)
    elif keep_minibatch:  # one equal-size KK per slice of the *configured* ppo_mini_batch_size rows
        mbs = ppo_mini_batch_size
        partitions = [[] for _ in range(dp_size)]
        for m in range(len(workloads) // mbs):
            parts = get_seqlen_balanced_partitions(workloads[m * mbs : (m + 1) * mbs], dp_size, equal_size=True)
            for rank, part in enumerate(parts):
                partitions[rank].extend(i + m * mbs for i in part)
    elif _numpy_path(lens, dp_size):
        partitions = _balanced_order_np(workloads, dp_size)
    else:
        partitions = get_seqlen_balanced_partitions(workloads, dp_size, equal_size=True)
    if not use_prefix_grouper and not isinstance(partitions, np.ndarray):  # small ... large ... small in each rank
        for rank, part in enumerate(partitions):
            part = sorted(part, key=workloads.__getitem__)  # part is ascending, so ties keep verl's (workload, i)
            partitions[rank] = part[::2] + part[1::2][::-1]
    if isinstance(partitions, np.ndarray):
        global_idx, partitions = partitions.ravel().tolist(), partitions.tolist()
    else:
        global_idx = [i for part in partitions for i in part]
    if not global_idx and lens:  # keep_minibatch with fewer rows than one mini-batch: verl's index is a float tensor
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    metrics = log_seqlen_unbalance(lens, partitions, logging_prefix)
    return BalanceResult(global_idx=global_idx, partitions=partitions, metrics=metrics, workloads=workloads)
