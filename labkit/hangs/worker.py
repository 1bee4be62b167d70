"""The rank side of the hang lab: one stage of verl's batch pipeline with its real collectives, and nothing else.

Each method runs a stage the way verl's worker sequences it, on real processes and real gloo collectives with a
short timeout: the micro-batch count (``labkit.balance.micro_batches.rearrange_micro_batches``, the DP MAX sync
through a real all-reduce or skipped), then per micro-batch the collectives FSDP issues (a parameter all-gather
per forward; in an update a re-gather per backward, a gradient reduce-scatter, one grad-norm all-reduce per
optimizer step), under the planner's names (``labkit.rules.collectives``). There is no model: the computation
between collectives is not what hangs. A rank never raises: it returns what it did, where it stopped and its
collective log, so the driver can diagnose a hang rank by rank.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from labkit.balance.micro_batches import rearrange_micro_batches
from labkit.rules.collectives import micro_batch_sync_name
from labkit.runtime import dist, meshes
from labkit.runtime.worker import Dispatch, Worker, register

PARAM_SHARD = 64  # elements of each rank's stand-in parameter shard (all-gathered per forward)


def rss_bytes() -> int:
    """This process's resident memory now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HangWorker(Worker):
    """One rank of the lab: an actor mesh (dp, sp=1) over the world and a rollout mesh (dp, infer_tp)."""

    def __init__(self, tp: int = 1) -> None:
        super().__init__()
        self.mesh = meshes.actor_mesh(1)
        self.dp_rank = meshes.dp_rank(self.mesh)
        self.dp_group = self.mesh.get_group("dp")
        self._register_dispatch_collect_info("actor", dp_rank=self.dp_rank, is_collect=True, sp_rank=0)
        self.rollout = meshes.rollout_mesh(tp)
        self.tp_rank, self.tp_group = meshes.tp_rank(self.rollout), self.rollout.get_group("infer_tp")
        self.shard = torch.full((PARAM_SHARD,), float(self.rank))

    @classmethod
    def check_world(cls, world_size: int, tp: int = 1, **_: Any) -> None:
        """The rollout mesh's E23 on the driver, before any process starts."""
        meshes.check_rollout_mesh(world_size, tp)

    # ---- the collectives of one micro-batch ----------------------------------------------------------------------
    def _forward(self) -> None:
        dist.all_gather(self.shard, None, _name="all_gather(params)")

    def _backward(self, synced: bool) -> None:
        dist.all_gather(self.shard, None, _name="all_gather(params):backward")
        if synced:
            grads = torch.ones(PARAM_SHARD * self.world_size)
            dist.reduce_scatter(grads, None, name="reduce_scatter(grads)")

    def _result(self, stage: str, t0: float, since: int, before: dict, **fields: Any) -> dict[str, Any]:
        after = dist.collective_counts()
        counts = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        out = {
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "tp_rank": self.tp_rank,
            "stage": stage,
            "outcome": "ok",
            "counts": counts,
            "elapsed_s": time.time() - t0,
            "error": None,
            "report": None,
        }
        out.update(fields)
        out["log"] = dist.collective_log(since)
        return out

    def _failed(self, exc: BaseException, stage: str, t0: float, since: int, before: dict, **fields: Any) -> dict:
        if isinstance(exc, dist.CollectiveTimeout):
            return self._result(
                stage, t0, since, before, outcome="timeout", error=str(exc), report=exc.report, **fields
            )
        report = dist.rank_report()
        dist.note(type(exc).__name__, "raised", time.time())
        text = f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} (a bare assert)"
        return self._result(stage, t0, since, before, outcome="raised", error=text, report=report, **fields)

    # ---- (a), (b) and their fixes: dynamic micro-batches ----------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def micro_batch_stage(
        self,
        lengths: list[list[int]],
        budget: int,
        *,
        profile: str = "legacy",
        sync: bool = True,
        stage: str = "old_log_prob",
        update: bool = False,
        width: int | None = None,
        pad_light: bool = False,
    ) -> dict[str, Any]:
        """Cut this DP rank's rows (``lengths[dp_rank]``) into dynamic micro-batches and run their collectives.

        sync False skips the MAX sync (verl's ``dp_group is None`` guard, #5750); pad_light adds dummy micro-batches
        where the synced count exceeds the rows (EasyR1 PR #11012). engine adds the global token all-reduce."""
        t0, since, before = time.time(), dist.log_length(), dist.collective_counts()
        own = [int(x) for x in lengths[self.dp_rank]]
        n_micro = None
        with dist.where(stage):
            try:
                if profile == "engine":
                    if update:  # train_mini_batch: row lengths gathered for MFU (one mini-batch here)
                        dist.all_gather_object(own, self.dp_group, name="all_gather_object(global_token_num)")
                    tokens = torch.tensor([sum(own)], dtype=torch.long)
                    dist.all_reduce(tokens, "sum", self.dp_group, name="all_reduce(sum):batch_num_tokens")
                seen = {"max": 0, "synced": 0}  # MAX syncs so far; the synced count (pad_light)

                def dp_sync(op: str, values: list[int]) -> list[int]:
                    name = micro_batch_sync_name(op, seen["max"])
                    seen["max"] += op == "max"
                    t = torch.tensor(values, dtype=torch.long)
                    dist.all_reduce(t, op, None if profile == "legacy" else self.dp_group, name=name)
                    if pad_light and name == "all_reduce(max):num_micro_batches":
                        seen["synced"] = int(t[0])  # the fork: as many real buckets as rows allow, dummies after
                        t[0] = min(int(t[0]), len(own))
                    return t.tolist()

                plan = rearrange_micro_batches(
                    own, budget, profile=profile, dp_sync=dp_sync if sync else None, max_seq_len=width
                )
                parts = list(plan.indices)
                dummies = max(0, seen["synced"] - len(parts)) if pad_light else 0
                n_micro = len(parts) + dummies
                for i in range(n_micro):
                    with dist.where(stage, i):
                        self._forward()
                        if update:
                            self._backward(synced=profile == "legacy" or i == n_micro - 1)
                with dist.where(stage, None):
                    if update:
                        dist.all_reduce(torch.ones(1), "sum", None, name="all_reduce(sum):grad_norm")
                    if profile == "engine":  # _postprocess_output: loss AVG-reduced, metrics gathered over DP
                        dist.all_reduce(torch.zeros(1), "avg", self.dp_group, name="all_reduce(avg):loss")
                        dist.all_gather_object({}, self.dp_group, name="all_gather_object(metrics)")
            except (dist.CollectiveTimeout, AssertionError, ValueError) as exc:
                return self._failed(exc, stage, t0, since, before, micro_batches=n_micro, rows=len(own))
        with dist.where(stage):
            dist.note("return", "ok", time.time())
        return self._result(stage, t0, since, before, micro_batches=n_micro, rows=len(own), dummies=dummies)

    # ---- (c): a micro size normalised to 0 --------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def static_stage(
        self, rows: int, micro: int, *, stage: str = "old_log_prob", max_s: float = 2.0, max_growth_mb: float = 48.0
    ) -> dict[str, Any]:
        """``split(micro)`` of this rank's rows, then one forward per piece. micro 0 is legacy verl's loop (#12,
        #2490): the offset never advances, an empty piece is appended per turn and memory climbs; the lab stops it
        after ``max_s`` seconds or ``max_growth_mb`` of growth, and reports the rate."""
        t0, since, before = time.time(), dist.log_length(), dist.collective_counts()
        with dist.where(stage):
            if micro == 0:
                pieces: list[torch.Tensor] = []
                rows_tensor = torch.arange(rows)
                rss0, start, offset, turns = rss_bytes(), time.monotonic(), 0, 0
                while offset < rows:  # what split(0) did: offset += 0
                    pieces.append(rows_tensor[offset : offset + micro].clone())
                    offset += micro
                    turns += 1
                    if turns % 4096 == 0 and (
                        time.monotonic() - start > max_s or rss_bytes() - rss0 > max_growth_mb * 2**20
                    ):
                        break
                looped = time.monotonic() - start
                growth = rss_bytes() - rss0
                dist.note("split(0) loop", "stopped", t0, pieces=len(pieces))
                del pieces
                return self._result(
                    stage,
                    t0,
                    since,
                    before,
                    outcome="looping",
                    micro_batches=turns,
                    rows=rows,
                    loop_s=looped,
                    rss_growth_bytes=growth,
                    bytes_per_s=growth / looped if looped > 0 else 0.0,
                    error=f"split({micro}) never advanced: {turns:,} empty micro-batches in {looped:.1f} s",
                )
            n = -(-rows // micro)
            try:
                for i in range(n):
                    with dist.where(stage, i):
                        self._forward()
            except dist.CollectiveTimeout as exc:
                return self._failed(exc, stage, t0, since, before, micro_batches=n, rows=rows)
        with dist.where(stage):
            dist.note("return", "ok", time.time())
        return self._result(stage, t0, since, before, micro_batches=n, rows=rows)

    # ---- (d): the <= v0.5 TP all-gather of the generation inputs -------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def tp_gather_stage(self, rows_per_rank: list[int], width: int = 8, *, stage: str = "generate") -> dict:
        """≤ v0.5 ``all_gather_data_proto`` of this rank's rows inside its rollout TP group before generate.

        Equal rows: one real all_gather of the batch (``labkit.runtime.dist.all_gather_data_proto``). Unequal rows:
        NCCL does not check the sizes, and the side with more rows waits for data the other never sends (gloo checks
        and aborts the process instead), so the lab sends the rows one all-gather each: the longer side waits past
        the timeout, as NCCL's does."""
        from labkit.protocol.data_proto import DataProto

        t0, since, before = time.time(), dist.log_length(), dist.collective_counts()
        own = int(rows_per_rank[self.rank])
        group_rows = [int(rows_per_rank[r]) for r in meshes.group_ranks(self.tp_group)]
        ids = torch.full((own, width), self.rank, dtype=torch.long)
        with dist.where(stage):
            try:
                if len(set(group_rows)) == 1:
                    data = DataProto.from_dict(tensors={"input_ids": ids})
                    gathered = len(dist.all_gather_data_proto(data, self.tp_group))
                else:
                    gathered = 0
                    for i in range(own):
                        gathered += len(dist.all_gather(ids[i], self.tp_group, _name="all_gather(data_proto)"))
            except dist.CollectiveTimeout as exc:
                return self._failed(exc, stage, t0, since, before, rows=own, group_rows=group_rows)
        with dist.where(stage):
            dist.note("return", "ok", time.time())
        return self._result(stage, t0, since, before, rows=own, group_rows=group_rows, gathered_rows=gathered)
