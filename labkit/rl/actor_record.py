"""What an actor call saw on one rank, in the planner's format, and how the driver files it into the live trace.

A rank fills a ``CallRecord`` while it runs (micro-batch rows/tokens/padded tokens/workload and collectives under the
names of ``labkit.rules.collectives.COLLECTIVES``); the driver fetches the records after the call and writes them into the
group's live ``StepTrace`` so ``labkit.trace.compare(plan(...), wg.trace)`` lines up. The driver-side client is ``labkit.rl.actor_client``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from labkit.protocol.data_proto import DataProto
from labkit.rl import actor_math as am
from labkit.rules.geometry import ulysses_padded
from labkit.runtime import dist
from labkit.trace import MicroBatchRecord

_INTERNAL = "take_records"


class CallRecord:
    """Per-rank record of one data call. Collectives issued once per pass (FSDP's per-unit all-gathers, Ulysses'
    per-layer all-to-alls) are counted once per forward/backward pass, as the planner counts them."""

    def __init__(self, worker: Any, data: DataProto) -> None:
        self.offset = worker.dp_rank * len(data)
        self.width = int(data.batch["input_ids"].shape[1])
        self.micro_batches: list[dict] = []
        self.collectives: Counter = Counter()
        self.mini_batches: list[int] = []
        self.extra: dict[str, Any] = {}

    def count(self, name: str, times: int = 1, micro: bool = False) -> None:
        """Count a collective of this call; ``micro``: it belongs to the latest micro-batch (its forward/backward),
        also listed per micro-batch in extra["micro_collectives"]."""
        self.collectives[name] += times
        if micro:
            per = self.extra.setdefault("micro_collectives", [])
            while len(per) < len(self.micro_batches):
                per.append({})
            per[-1][name] = per[-1].get(name, 0) + times

    def micro(self, rows: list[int], mask: torch.Tensor, rmpad: bool, sp: int, pad_to_longest: bool = False) -> None:
        """A micro-batch of the rank's rows ``rows`` (positions in the dispatched chunk); padded tokens as fed: packed
        (+ Ulysses pad), rows x the longest row (engine, rmpad off) or rows x the full width (dp_actor, rmpad off)."""
        lens = mask.sum(-1).tolist()
        tokens = int(sum(lens))
        padded = (
            ulysses_padded(tokens, sp)
            if rmpad
            else len(rows) * max(lens, default=0)
            if pad_to_longest
            else len(rows) * self.width
        )
        self.micro_batches.append(
            {
                "rows": len(rows),
                "tokens": tokens,
                "padded_tokens": padded,
                "workload": am.workload(lens),
                "indices": [self.offset + int(i) for i in rows],
            }
        )

    def forward(self, before: dict[str, int], sp: int) -> None:
        """After one micro-batch forward: FSDP unsharded the parameters; with SP, attention ran its all-to-alls and
        the outputs were gathered (both observed through labkit.runtime.dist's counters)."""
        self.count("all_gather(params)", micro=True)
        if sp > 1:
            after = dist.collective_counts()
            if after.get("all_to_all", 0) > before.get("all_to_all", 0):
                self.count("all_to_all(ulysses)", micro=True)
            if after.get("all_gather", 0) > before.get("all_gather", 0):
                self.count("all_gather(ulysses_outputs)", micro=True)

    def backward(self, before: dict[str, int], sp: int, synced: bool) -> None:
        """After one micro-batch backward: parameters re-gathered, gradients reduce-scattered when sync is on."""
        self.count("all_gather(params):backward", micro=True)
        if synced:
            self.count("reduce_scatter(grads)", micro=True)
        if sp > 1 and dist.collective_counts().get("all_to_all", 0) > before.get("all_to_all", 0):
            self.count("all_to_all(ulysses):backward", micro=True)

    def finish(self) -> dict[str, Any]:
        return {
            "micro_batches": self.micro_batches,
            "collectives": dict(self.collectives),
            "mini_batches": self.mini_batches,
            "extra": self.extra,
        }


def drop_call(wg: Any, stage: str) -> None:
    """Remove a bookkeeping call (take_records, configure) from the live trace."""
    wg.trace.ranks = [r for r in wg.trace.ranks if r.stage != stage]
    wg.trace.stages = [s for s in wg.trace.stages if s.name != stage]


def attach_records(wg: Any, stage: str, per_rank: list[list[dict]]) -> None:
    """Write the ranks' records of the latest call of ``stage`` into wg.trace (micro-batches, planner-named
    collectives; labkit.runtime.dist's raw counts move to extra["raw_collectives"]) and drop the bookkeeping call."""
    trace = wg.trace
    drop_call(wg, _INTERNAL)
    latest = {}
    for rec in trace.ranks:
        if rec.stage == stage:
            latest[rec.rank] = rec
    for rank, records in enumerate(per_rank):
        if not records or rank not in latest:
            continue
        got, rr = records[-1], latest[rank]
        rr.micro_batches = [MicroBatchRecord(**m) for m in got["micro_batches"]]
        rr.padded_tokens = sum(m.padded_tokens for m in rr.micro_batches) if rr.micro_batches else None
        rr.workload = sum(m.workload for m in rr.micro_batches) if rr.micro_batches else None
        rr.mini_batches = list(got["mini_batches"])
        rr.extra["raw_collectives"] = rr.collectives
        rr.extra.update(got["extra"])
        rr.bytes_measured = got["extra"].get("bytes_measured", rr.bytes_measured)
        rr.collectives = dict(got["collectives"])
