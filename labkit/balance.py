"""Sequence balancing: the Karmarkar-Karp partitioner and the trainer's `_balance_batch` across DP ranks.

Mirrors verl/utils/seqlen_balancing.py (karmarkar_karp, greedy_partition, get_seqlen_balanced_partitions,
get_group_balanced_partitions, log_seqlen_unbalance) and verl/trainer/ppo/ray_trainer.py: RayPPOTrainer._balance_batch.
Partitions are identical to verl's, tie-breaks included, but computed with integer keys instead of per-comparison
Python methods (verl-reference.md §6.1 has the algorithm; the proof of the shortcut is in `_kk_int`).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from dataclasses import dataclass, field
from itertools import chain
from operator import neg
from typing import Any, Sequence

import numpy as np

WORKLOAD_LINEAR = 24576  # 12·h²/(2h) with h = 4096 ("7B"), verl's calculate_workload constant
_NUMPY_MIN_K = 48  # equal-size KK with at least this many partitions runs on numpy rows (faster for wide states)


def calculate_workload(seqlens: Any) -> Any:
    """24576·L + L² per sequence; arrays/tensors keep their dtype, lists give ints. Mirrors calculate_workload."""
    if isinstance(seqlens, (list, tuple)):
        return [WORKLOAD_LINEAR * s + s * s for s in seqlens]
    return WORKLOAD_LINEAR * seqlens + seqlens**2


def _as_values(seq: Any) -> list:
    """Plain Python values: ints stay exact; floats keep their precision (float32 tensors become numpy float32)."""
    if isinstance(seq, (list, tuple)):
        return list(seq)
    if hasattr(seq, "is_floating_point"):  # torch.Tensor, without importing torch
        return list(seq.detach().cpu().numpy()) if seq.is_floating_point() else seq.tolist()
    if isinstance(seq, np.ndarray):
        return seq.tolist() if seq.dtype.kind in "iu" else list(seq)
    return list(seq)


def _kk_int(values: list[int], k: int, equal_size: bool) -> list[list[int]]:
    """Karmarkar-Karp on non-negative ints, with each set packed into one int key.

    verl orders sets by (sum, #items, items-list); sets are disjoint, so the list comparison is decided by the first
    index, and key = sum·M² + #items·M + first_index (M = N+1) orders sets exactly like verl. A state is the list of
    its non-empty set keys, descending (empty sets sum to 0 with no items, so they sort last). verl's heap order is
    (larger spread, then larger first set); the first set's key is unique, so this order is strict and any priority
    queue pops the same states as verl's heapq. Merges are logged and replayed at the end to list items in order.
    """
    n = len(values)
    M = n + 1
    MM = M * M
    singles = sorted([v * MM + M + i for i, v in enumerate(values)])  # one-item sets, ascending (value, index)
    heap: list[tuple[int, int, list[int]]] = []  # (-spread, -top set key, set keys descending)
    stream: list[int] = []  # free mode: one-item states, kept out of the heap; the largest pops first
    log_a: list[int] = []  # set merges in order: key of the receiving set ...
    log_b: list[int] = []  # ... and of the set merged into it
    if equal_size:  # each group of k consecutive items fills the k sets of one state; states stay full
        for off in range(0, n, k):
            keys = singles[off : off + k][::-1]
            heap.append((keys[-1] // MM - keys[0] // MM, -keys[0], keys))
        heapq.heapify(heap)
        a, pop, pushpop = heapq.heappop(heap)[2], heapq.heappop, heapq.heappushpop
        while heap:
            b = pop(heap)[2][::-1]
            log_a += a
            log_b += b
            a = [x + y - y % M for x, y in zip(a, b)]
            a.sort(reverse=True)
            top = a[0]
            a = pushpop(heap, (a[-1] // MM - top // MM, -top, a))[2]
        return _replay(log_a, log_b, a, n, M)
    stream = singles
    lone = 1 if k > 1 else 0  # a one-item state's spread is its value when it has an empty set

    def single_first() -> bool:  # does the next one-item state pop before every state in the heap?
        return not heap or (-(stream[-1] // MM) * lone, -stream[-1]) < heap[0][:2]

    a = [stream.pop()]
    while heap or stream:
        p = len(a)
        if stream and single_first():
            if p == k:  # B is one item: it joins A's smallest set
                s, x = stream.pop(), a.pop()
                log_a.append(x)
                log_b.append(s)
                insort(a, x + s - s % M, key=neg)
            else:  # A has empty sets: the one-item states that pop before the heap top fill them, largest last
                lo = len(stream) - (k - p)
                if heap:
                    spread, top = -heap[0][0], -heap[0][1]
                    lo = max(lo, bisect_left(stream, (spread + 1) * MM if top // MM > spread else top + 1))
                a += stream[lo:][::-1]  # each is smaller than all of A's sets
                del stream[lo:]
                if len(a) < k:  # still has an empty set: spread and top unchanged, so A is popped again next
                    continue
        else:
            b = heapq.heappop(heap)[2]
            q = len(b)
            r = k - q  # set i of A receives set k-1-i of B; B's non-empty sets land on i >= r
            if p <= r:  # no overlap: the sets are pooled
                a += b
                a.sort(reverse=True)
                if p + q < k:
                    continue
            else:  # overlap: the merged state has k non-empty sets
                a_mid, b_mid = a[r:p], b[k - p : q][::-1]
                log_a += a_mid
                log_b += b_mid
                a = a[:r] + [x + y - y % M for x, y in zip(a_mid, b_mid)] + b[: k - p]
                a.sort(reverse=True)
        top = a[0]
        key = (a[-1] // MM - top // MM, -top)
        if (heap and heap[0][:2] < key) or (stream and (-(stream[-1] // MM) * lone, -stream[-1]) < key):
            heapq.heappush(heap, (*key, a))
            a = [stream.pop()] if stream and single_first() else heapq.heappop(heap)[2]
    return _replay(log_a, log_b, a, n, M) + [[] for _ in range(k - len(a))]


def _replay(log_a: list[int], log_b: list[int], final: list[int], n: int, M: int) -> list[list[int]]:
    """Item indices of the final sets in insertion order: replay the logged set merges as linked lists."""
    nxt, tail = [-1] * n, list(range(n))  # each set is named by its first index
    for x, y in zip(log_a, log_b):
        fx, fy = x % M, y % M
        nxt[tail[fx]] = fy
        tail[fx] = tail[fy]
    partitions = []
    for key in final:
        f, part = key % M, []
        while f >= 0:
            part.append(f)
            f = nxt[f]
        partitions.append(part)
    return partitions


def _kk_equal_np(values: list[int], k: int) -> list[list[int]]:
    """Equal-size Karmarkar-Karp on non-negative ints with int64 numpy rows (same order as `_kk_int`, for large k).

    A state is a 2×k array (first index, sum) sorted descending, plus its item count per set: all k sets of an
    equal-size state hold the same number of items, so verl's set order reduces to (sum, first index) inside a state,
    and to (sum, count, first index) between states. Sets stay equal-sized, so the linked lists are walked in lockstep.
    """
    n = len(values)
    M = n + 1
    vals = np.asarray(values, dtype=np.int64)
    groups = np.argsort(vals, kind="stable").reshape(-1, k)[:, ::-1]  # (value, index) ascending, sets descending
    sums = vals[groups]
    states = list(np.stack([groups, sums], axis=1))
    counts = [1] * len(states)
    heap = list(zip((sums[:, -1] - sums[:, 0]).tolist(), (-sums[:, 0]).tolist(), (-M - groups[:, 0]).tolist(),
                    range(len(states))))
    heapq.heapify(heap)
    log = []
    pop = heapq.heappop
    while len(heap) > 1:
        ga, gb = pop(heap)[3], pop(heap)[3]
        a, b = states[ga], states[gb]
        log.append((a[0], b[0, ::-1]))  # set i of A receives set k-1-i of B
        x = a.copy()
        x[1] += b[1, ::-1]
        x = x[:, np.lexsort(x)[::-1]]  # descending by (sum, first index)
        states[ga], counts[ga] = x, counts[ga] + counts[gb]
        f0, s0 = x[:, 0].tolist()
        heapq.heappush(heap, (x[1, -1].item() - s0, -s0, -counts[ga] * M - f0, ga))
    nxt, tail = np.full(n, -1, dtype=np.int64), np.arange(n)
    for fa, fb in log:  # within one merge the k sets are distinct, so each step is a vector update
        nxt[tail[fa]] = fb
        tail[fa] = tail[fb]
    rows = [states[heap[0][3]][0]]
    for _ in range(n // k - 1):
        rows.append(nxt[rows[-1]])
    return np.stack(rows, axis=1).tolist()


class _State:
    """A KK state for values that are not non-negative ints; compares exactly like verl's State.__lt__."""

    __slots__ = ("sets", "spread", "top")

    def __init__(self, sets: list[tuple]) -> None:
        sets.sort(key=lambda s: s[:3], reverse=True)  # (sum, #items, first index); empty sets are (0, 0, -1)
        self.sets, self.top = sets, sets[0][:3]
        self.spread = sets[0][0] - sets[-1][0]

    def __lt__(self, other: "_State") -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return other.top < self.top


def _kk_generic(values: list, k: int, equal_size: bool) -> list[list[int]]:
    """Karmarkar-Karp for floats, negative values or scalar objects: verl's heapq sequence with exact comparisons.

    Set sums are accumulated item by item in verl's order, so float rounding matches; ties in the heap (possible only
    when the largest set is empty, i.e. with negative values) fall to heap position exactly as in verl.
    """
    empty = (0, 0, -1, ())
    ordered = sorted([(v, i) for i, v in enumerate(values)])
    states: list[_State] = []
    step = k if equal_size else 1
    for off in range(0, len(values), step):
        group = [(0 + v, 1, i, (i,)) for v, i in ordered[off : off + step]]
        heapq.heappush(states, _State(group + [empty] * (k - len(group))))
    while len(states) > 1:
        a, b = heapq.heappop(states), heapq.heappop(states)
        merged = []
        for (sa, ca, fa, ia), (sb, cb, fb, ib) in zip(a.sets, reversed(b.sets)):
            if cb == 0:
                merged.append((sa, ca, fa, ia))
            elif ca == 0:
                merged.append((sb, cb, fb, ib))
            else:
                for i in ib:
                    sa += values[i]
                merged.append((sa, ca + cb, fa, ia + ib))
        heapq.heappush(states, _State(merged))
    return [list(s[3]) for s in states[0].sets]


def karmarkar_karp(seqlen_list: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """k partitions by the largest differencing method, items in insertion order. Mirrors karmarkar_karp."""
    values = _as_values(seqlen_list)
    n = len(values)
    if equal_size:
        assert n % k_partitions == 0, f"{n} % {k_partitions} != 0"
    if n == 0 or k_partitions <= 0:
        raise IndexError("list index out of range")  # verl indexes an empty heap / an empty list of sets
    if set(map(type, values)) == {int} and min(values) >= 0:
        if equal_size and k_partitions >= _NUMPY_MIN_K and sum(values) < 2**62:
            partitions = _kk_equal_np(values, k_partitions)
        else:
            partitions = _kk_int(values, k_partitions, equal_size)
    else:
        partitions = _kk_generic(values, k_partitions, equal_size)
    if equal_size:
        for part in partitions:
            assert len(part) * k_partitions == n, f"{len(part)} * {k_partitions} != {n}"
    return partitions


def greedy_partition(seqlen_list: Any, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Assign items in input order to the lightest partition (bias sum+1 per item if equal_size).

    Mirrors seqlen_balancing.greedy_partition (no caller in verl)."""
    values = _as_values(seqlen_list)
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
    lens = _as_values(seqlen_list)
    group_workloads = [sum(WORKLOAD_LINEAR * int(lens[i]) + int(lens[i]) ** 2 for i in g) for g in groups]
    parts = get_seqlen_balanced_partitions(group_workloads, k_partitions, equal_size=True)
    return [sorted(i for g in part for i in groups[g]) for part in parts]


def log_seqlen_unbalance(seqlen_list: Sequence[int], partitions: list[list[int]], prefix: str) -> dict[str, Any]:
    """Token sums of contiguous chunks (no balancing) vs of the partitions, under verl's metric names.

    Mirrors seqlen_balancing.log_seqlen_unbalance."""
    lens = _as_values(seqlen_list)
    chunk = len(lens) // len(partitions)
    chunk_sums = [sum(lens[off : off + chunk]) for off in range(0, len(lens), chunk)]
    balanced = [sum(lens[i] for i in part) for part in partitions]
    return {
        f"{prefix}/min": min(chunk_sums),
        f"{prefix}/max": max(chunk_sums),
        f"{prefix}/minmax_diff": max(chunk_sums) - min(chunk_sums),
        f"{prefix}/balanced_min": min(balanced),
        f"{prefix}/balanced_max": max(balanced),
        f"{prefix}/mean": sum(chunk_sums) / len(partitions),
    }


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
    lens = [int(s) for s in _as_values(seqlens)]
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
    else:
        partitions = get_seqlen_balanced_partitions(workloads, dp_size, equal_size=True)
    if not use_prefix_grouper:  # small ... large ... small inside each rank
        for rank, part in enumerate(partitions):
            part = sorted(part, key=lambda i: (workloads[i], i))
            partitions[rank] = part[::2] + part[1::2][::-1]
    global_idx = [i for part in partitions for i in part]
    if not global_idx and lens:  # keep_minibatch with fewer rows than one mini-batch: verl's index is a float tensor
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    metrics = log_seqlen_unbalance(lens, partitions, logging_prefix)
    return BalanceResult(global_idx=global_idx, partitions=partitions, metrics=metrics, workloads=workloads)
