"""Every DP rank's micro-batching at once: verl's all-reduces answered in lockstep, the KK partitions batched.

`labkit.balance.micro_batches` writes one rank's rearrange_micro_batches as a generator that yields each DP all-reduce and each
KK partition it needs; `lockstep` drives many such ranks (and several mini-batches) the way D real ranks would run,
which is how the planner predicts a whole DP group without processes.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from labkit.balance.balance_batch import get_seqlen_balanced_partitions
from labkit.balance.kk import kk_free_batch

_BATCH_MIN_RANKS, _BATCH_MAX_ROWS = 16, 160  # lockstep numpy KK beats per-rank KK on many short rows (bench_balance)
Steps = Generator[tuple[str, Any], Any, Any]  # yields ("max"|"min", values) or ("kk", (workloads, k))


def free_partitions(workloads: list[int], k: int) -> list[list[int]]:
    """One rank's micro-batch partition: free-size KK with verl's checks (get_seqlen_balanced_partitions).
    One micro-batch holds every row (KK merges all states into one), sorted."""
    if k == 1 and workloads:
        return [list(range(len(workloads)))]
    return get_seqlen_balanced_partitions(workloads, k, equal_size=False)


def partitions_of_ranks(requests: dict[Any, tuple[list[int], int]]) -> dict[Any, list[list[int]]]:
    """Every rank's KK partitions ((batch, dp_rank) -> (workloads, k)); ranks with the same row count and k run in
    lockstep (`labkit.balance.kk.kk_free_batch`) when there are enough of them. A rank verl would fail on is re-run alone so
    that it raises verl's error, in rank order."""
    groups: dict[tuple[int, int], list[Any]] = {}
    for r, (w, k) in requests.items():
        groups.setdefault((len(w), k), []).append(r)
    out: dict[int, list[list[int]]] = {}
    for (n, k), ranks in groups.items():
        rows = [requests[r][0] for r in ranks]
        if len(ranks) >= _BATCH_MIN_RANKS and 1 < k <= n <= _BATCH_MAX_ROWS and all(type(x) is int for x in rows[0]):
            try:
                batch = kk_free_batch(np.array(rows, dtype=np.int64), k)
            except (AssertionError, OverflowError):  # negative values or int64 overflow: the exact path decides
                batch = None
            if batch is not None:
                out.update((r, parts) for r, parts in zip(ranks, batch) if all(parts))
    for r in sorted(requests):
        if r not in out:
            try:
                out[r] = free_partitions(*requests[r])
            except Exception as err:
                err.add_note(f"raised on dp_rank {r[1]}")
                raise
    return out


def lockstep(gens: dict[tuple[int, int], Steps]) -> dict[tuple[int, int], Any]:
    """Drive every (batch, dp_rank) plan: all-reduces are answered within each batch's ranks, KK requests of all
    ranks together. A rank that raises gets a note with its dp_rank."""
    plans: dict[tuple[int, int], Any] = {}
    replies: dict[tuple[int, int], Any] = dict.fromkeys(gens)
    active = list(gens)
    while active:
        requests: dict[tuple[int, int], tuple[str, Any]] = {}
        for key in active:
            try:
                requests[key] = gens[key].send(replies[key])
            except StopIteration as done:
                plans[key] = done.value
            except Exception as err:
                err.add_note(f"raised on dp_rank {key[1]}")
                raise
        replies = {}
        kk = {key: v for key, (op, v) in requests.items() if op == "kk"}
        if kk:
            replies.update(partitions_of_ranks(kk))
        by_group: dict[int, dict[tuple[int, int], tuple[str, Any]]] = {}
        for key, req in requests.items():
            by_group.setdefault(key[0], {})[key] = req
        for g, reqs in by_group.items():
            ops = {op for op, _ in reqs.values()}
            if ops == {"kk"}:  # KK is local: ranks may run it a different number of times
                continue
            if len(reqs) != sum(1 for key in active if key[0] == g):
                raise RuntimeError("DP ranks disagree on the all-reduce sequence: verl would hang here")
            assert len(ops) == 1, f"DP ranks issue different all-reduces: {ops}"
            reduce = max if ops.pop() == "max" else min
            reduced = [reduce(col) for col in zip(*(v for _, v in reqs.values()))]
            replies.update((key, list(reduced)) for key in reqs)
        active = list(requests)
    return plans
