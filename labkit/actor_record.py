"""What an actor call saw on one rank, in the planner's format, and the driver-side API of the actor group.

A rank fills a ``CallRecord`` while it runs (micro-batch rows/tokens/padded tokens/workload and collectives under the
names of ``labkit.plan_ctx.COLLECTIVES``); the driver fetches the records after the call and writes them into the
group's live ``StepTrace`` so ``labkit.trace.compare(plan(...), wg.trace)`` lines up. The driver helpers also run
verl's input checks on the whole batch first (E26–E31), so bad input raises verl's error before any rank starts.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from labkit import actor_math as am
from labkit import dist
from labkit.protocol import DataProto
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

    def count(self, name: str, times: int = 1) -> None:
        self.collectives[name] += times

    def micro(self, rows: list[int], mask: torch.Tensor, rmpad: bool, sp: int, pad_to_longest: bool = False) -> None:
        """A micro-batch of the rank's rows ``rows`` (positions in the dispatched chunk); padded tokens as fed: packed
        (+ Ulysses pad), rows x the longest row (engine, rmpad off) or rows x the full width (dp_actor, rmpad off)."""
        lens = mask.sum(-1).tolist()
        tokens = int(sum(lens))
        padded = (am.ulysses_padded(tokens, sp) if rmpad else len(rows) * max(lens, default=0) if pad_to_longest
                  else len(rows) * self.width)
        self.micro_batches.append({"rows": len(rows), "tokens": tokens, "padded_tokens": padded,
                                   "workload": am.workload(lens), "indices": [self.offset + int(i) for i in rows]})

    def forward(self, before: dict[str, int], sp: int) -> None:
        """After one micro-batch forward: FSDP unsharded the parameters; with SP, attention ran its all-to-alls and
        the outputs were gathered (both observed through labkit.dist's counters)."""
        self.count("all_gather(params)")
        if sp > 1:
            after = dist.collective_counts()
            if after.get("all_to_all", 0) > before.get("all_to_all", 0):
                self.count("all_to_all(ulysses)")
            if after.get("all_gather", 0) > before.get("all_gather", 0):
                self.count("all_gather(ulysses_outputs)")

    def backward(self, before: dict[str, int], sp: int, synced: bool) -> None:
        """After one micro-batch backward: parameters re-gathered, gradients reduce-scattered when sync is on."""
        self.count("all_gather(params):backward")
        if synced:
            self.count("reduce_scatter(grads)")
        if sp > 1 and dist.collective_counts().get("all_to_all", 0) > before.get("all_to_all", 0):
            self.count("all_to_all(ulysses):backward")

    def finish(self) -> dict[str, Any]:
        return {"micro_batches": self.micro_batches, "collectives": dict(self.collectives),
                "mini_batches": self.mini_batches, "extra": self.extra}


def _drop(wg: Any, stage: str) -> None:
    """Remove a bookkeeping call (take_records, configure) from the live trace."""
    wg.trace.ranks = [r for r in wg.trace.ranks if r.stage != stage]
    wg.trace.stages = [s for s in wg.trace.stages if s.name != stage]


def attach_records(wg: Any, stage: str, per_rank: list[list[dict]]) -> None:
    """Write the ranks' records of the latest call of ``stage`` into wg.trace (micro-batches, planner-named
    collectives; labkit.dist's raw counts move to extra["raw_collectives"]) and drop the bookkeeping call."""
    trace = wg.trace
    _drop(wg, _INTERNAL)
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
        rr.collectives = dict(got["collectives"])


# ---- driver API -------------------------------------------------------------------------------------------------
def start_actor_group(world_size: int, settings: am.ActorSettings, **wg_kwargs: Any) -> Any:
    """A WorkerGroup of ActorWorkers (checks run on the driver first), with init_model done."""
    from labkit.actor import ActorWorker
    from labkit.controller import WorkerGroup

    wg = WorkerGroup(ActorWorker, world_size, init_kwargs=settings.as_dict(), profile=settings.profile, **wg_kwargs)
    try:
        wg.init_model()
    except BaseException:
        wg.close()
        raise
    wg.actor_settings = settings
    return wg


def configure(wg: Any, rebuild: bool = False, **changes: Any) -> am.ActorSettings:
    """Change the actor settings on every rank (and on the driver); see ActorWorker.configure."""
    new = wg.actor_settings.with_(**changes)
    from labkit.actor import check_settings

    check_settings(new, wg.world_size)
    wg.configure(rebuild=rebuild, **changes)
    _drop(wg, "configure")
    wg.actor_settings = new
    wg.trace.profile = new.profile
    return new


def _lengths_per_dp(data: DataProto, dp_size: int) -> list[list[int]]:
    lens = data.batch["attention_mask"].sum(-1).tolist()
    per = len(lens) // dp_size
    return [lens[r * per:(r + 1) * per] for r in range(dp_size)]


def precheck_log_prob(s: am.ActorSettings, data: DataProto, dp_size: int, which: str) -> None:
    """verl's errors for a log-prob call, on the driver: E26 (dispatch), E30 (engine static), E31 (dynamic)."""
    if len(data) % dp_size:
        data.chunk(dp_size)  # raises E26, verl's text
    p = am.log_prob_params(s, which)
    if p.dynamic:
        am.check_budget(s.profile, _lengths_per_dp(data, dp_size), data.batch["input_ids"].shape[1],
                        p.budget * s.ulysses_sequence_parallel_size)
    else:
        am.static_parts(s.profile, len(data) // dp_size, p.micro)


def precheck_update(s: am.ActorSettings, data: DataProto, dp_size: int, world_size: int) -> None:
    """verl's errors for update_actor, on the driver: E26, E20–E22 / E28, E29, E30, E31 on every mini-batch."""
    if len(data) % dp_size:
        data.chunk(dp_size)
    rows = len(data) // dp_size
    p = am.update_params(s)
    sp = s.ulysses_sequence_parallel_size
    if s.profile == "legacy":
        mini = am.legacy_normalized_mini(s.ppo_mini_batch_size, s.rollout_n, world_size, sp,
                                         s.ppo_micro_batch_size_per_gpu)
    else:
        mini = am.engine_mini(s.ppo_mini_batch_size, s.rollout_n, dp_size)
    per_dp = _lengths_per_dp(data, dp_size)
    for idx in am.mini_batch_rows(s.profile, rows, mini):
        if p.dynamic:
            am.check_budget(s.profile, [[lens[i] for i in idx] for lens in per_dp], data.batch["input_ids"].shape[1],
                            p.budget * sp)
        else:
            am.static_parts(s.profile, len(idx), p.micro)


def _call(wg: Any, method: str, data: DataProto, stage: str) -> Any:
    out = wg.call(method, data, _stage=stage)
    attach_records(wg, stage, wg.take_records())
    return out


def compute_log_prob(wg: Any, data: DataProto, stage: str = "old_log_prob") -> DataProto:
    """old_log_probs (+ entropys) of every row, in input order; the live trace gets the per-rank micro-batches."""
    precheck_log_prob(wg.actor_settings, data, wg.dp_size("actor"), "actor")
    return _call(wg, "compute_log_prob", data, stage)


def compute_ref_log_prob(wg: Any, data: DataProto, stage: str = "ref_log_prob") -> DataProto:
    """ref_log_prob of every row, in input order (reference model, ref.* micro-batching keys)."""
    precheck_log_prob(wg.actor_settings, data, wg.dp_size("actor"), "ref")
    return _call(wg, "compute_ref_log_prob", data, stage)


def update_actor(wg: Any, data: DataProto, stage: str = "update_actor") -> dict[str, float]:
    """One PPO update (ppo_epochs × mini-batches optimizer steps); returns the metrics reduced as verl's driver does."""
    s = wg.actor_settings
    precheck_update(s, data, wg.dp_size("actor"), wg.world_size)
    out = _call(wg, "update_actor", data, stage)
    metrics = out.meta_info["metrics"]
    per_rank = [{k: v[i] for k, v in metrics.items()} for i in range(len(next(iter(metrics.values()))))]
    return am.reduce_legacy(per_rank) if s.profile == "legacy" else am.reduce_engine(per_rank)
