"""Karmarkar-Karp (largest differencing) partitioning, exact to verl's heap order, one instance or many at once.

Mirrors verl/utils/seqlen_balancing.py: karmarkar_karp. Partitions are identical to verl's, tie-breaks included, but
computed with integer keys instead of per-comparison Python methods (the proof of the shortcut is in `_kk_int`). `kk_free_batch` runs many free-size instances in lockstep on numpy rows: what
the planner needs when every DP rank cuts its rows into the same number of micro-batches.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from operator import neg
from typing import Any

import numpy as np

NUMPY_MIN_K = 48  # equal-size KK with at least this many partitions runs on numpy rows (faster for wide states)


def as_values(seq: Any) -> list:
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


def kk_equal_np(values: Any, k: int, as_array: bool = False) -> Any:
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
    heap = list(
        zip(
            (sums[:, -1] - sums[:, 0]).tolist(),
            (-sums[:, 0]).tolist(),
            (-M - groups[:, 0]).tolist(),
            range(len(states)),
        )
    )
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
    parts = np.stack(rows, axis=1)  # (k, n/k): set j's items in insertion order
    return parts if as_array else parts.tolist()


class _State:
    """A KK state for values that are not non-negative ints; compares exactly like verl's State.__lt__."""

    __slots__ = ("sets", "spread", "top")

    def __init__(self, sets: list[tuple]) -> None:
        sets.sort(key=lambda s: s[:3], reverse=True)  # (sum, #items, first index); empty sets are (0, 0, -1)
        self.sets, self.top = sets, sets[0][:3]
        self.spread = sets[0][0] - sets[-1][0]

    def __lt__(self, other: _State) -> bool:
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
    values = as_values(seqlen_list)
    n = len(values)
    if equal_size:
        assert n % k_partitions == 0, f"{n} % {k_partitions} != 0"
    if n == 0 or k_partitions <= 0:
        raise IndexError("list index out of range")  # verl indexes an empty heap / an empty list of sets
    if set(map(type, values)) == {int} and min(values) >= 0:
        if equal_size and k_partitions >= NUMPY_MIN_K and sum(values) < 2**62:
            partitions = kk_equal_np(values, k_partitions)
        else:
            partitions = _kk_int(values, k_partitions, equal_size)
    else:
        partitions = _kk_generic(values, k_partitions, equal_size)
    if equal_size:
        for part in partitions:
            assert len(part) * k_partitions == n, f"{len(part)} * {k_partitions} != {n}"
    return partitions


def kk_free_batch(values: np.ndarray, k: int) -> list[list[list[int]]]:
    """Free-size Karmarkar-Karp on R instances at once: `values` is (R, N) non-negative int64, one row per instance;
    returns each instance's k partitions in verl's final-state order, indices sorted inside each (as
    get_seqlen_balanced_partitions returns them). Empty sets come back as [].

    The instances run in lockstep: every KK run on N items does N-1 merges, whatever the values. Each state is k set
    keys (the `_kk_int` packing, 0 = empty set) in a slot of an (R, N, k) array; a merge pops the two highest-priority
    live slots per row (larger spread, then larger top key: verl's State.__lt__), writes the merged state into the
    first and kills the second. Set membership is a union-find of first indices, resolved once at the end.
    """
    vals = np.asarray(values, dtype=np.int64)
    R, N = vals.shape
    M = N + 1
    MM = M * M
    assert not np.any(vals < 0) and int(vals.sum(axis=1).max(initial=0)) < (2**62) // (MM + 1), "int64 keys overflow"
    rows = np.arange(R)
    states = np.zeros((R, N, k), dtype=np.int64)
    states[:, :, 0] = vals * MM + M + np.arange(N)
    top = states[:, :, 0].copy()
    spread = vals.copy() if k > 1 else np.zeros_like(vals)  # a one-item state with an empty set spreads by its value
    parent = np.tile(np.arange(N), (R, 1))  # set merges: first index of the merged-in set -> of the receiving set
    parent_flat, row_base, dead = parent.reshape(-1), rows * N, np.int64(-1)

    def pop() -> np.ndarray:
        best = spread.max(axis=1, keepdims=True)
        slot = np.where(spread == best, top, dead).argmax(axis=1)
        spread[rows, slot] = dead
        return slot

    for _ in range(N - 1):
        i1 = pop()
        i2 = pop()
        a, b = states[rows, i1], states[rows, i2, ::-1]  # set i of A receives set k-1-i of B
        b_first = b % M
        a_full = a != 0
        joined = np.flatnonzero(a_full & (b != 0))
        if joined.size:
            parent_flat[row_base[joined // k] + b_first.ravel()[joined]] = a.ravel()[joined] % M
        merged = a + b - b_first * a_full  # sums and counts add; the receiving set keeps its first index
        merged.sort(axis=1)
        merged = merged[:, ::-1]
        states[rows, i1] = merged
        spread[rows, i1] = merged[:, 0] // MM - merged[:, -1] // MM
        top[rows, i1] = merged[:, 0]
    final = states[rows, spread.argmax(axis=1)]
    while True:  # pointer jumping: every index to the first index of its final set
        nxt = np.take_along_axis(parent, parent, axis=1)
        if np.array_equal(nxt, parent):
            break
        parent = nxt
    out = []
    for keys, roots in zip(final.tolist(), parent.tolist()):
        where = {key % M: j for j, key in enumerate(keys) if key}
        parts: list[list[int]] = [[] for _ in keys]
        for i, root in enumerate(roots):
            parts[where[root]].append(i)
        out.append(parts)
    return out
