"""The live GRPO step's trace next to the planner's: the group's trace plus the driver stages and a ``balance`` record
per rank, the memory model of labkit's CPU ranks that fills in the predicted bytes, ``prediction()`` (``plan()`` for
the same config and observed lengths) and ``mismatches()`` (``labkit.trace.compare`` of the two). The ``LiveTrace``
half of ``labkit.trainer.grpo_trainer.GRPOTrainer``.
"""

from __future__ import annotations

from collections.abc import Sequence

from labkit.config.verl_config import VerlConfig
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import fill_bytes_predicted
from labkit.plan.step import plan
from labkit.rules.run import Run
from labkit.runtime.worker_group import WorkerGroup
from labkit.trace import RankRecord, StageRecord, StepTrace
from labkit.trainer import v1_batch
from labkit.trainer.live_config import RolloutSizes

COMPARED = ("balance", "old_log_prob", "ref_log_prob", "update_actor")
FIELDS = ("rows", "tokens", "padded_tokens", "n_micro", "micro_rows", "micro_tokens", "mini_batches", "collectives")
LIVE_MEMORY_PHASES = ("old_log_prob", "ref_log_prob", "update_actor")


def live_memory_settings(cfg: VerlConfig | Run) -> MemorySettings:
    """The memory model of labkit's CPU ranks: the tiny shape in fp32, FSDP2 over W ranks (one layer gathered at a
    time), sdpa's dense mask, the PyTorch log-softmax, no autocast and an eager entropy, a reference always built; generate runs the rollout engine
    (its plan: ``labkit.plan.rollout_engine``), so only the FSDP phases are predicted."""
    return MemorySettings.from_config(
        cfg, "tiny-qwen2", 2**40, compute_bytes=4, rollout_bytes=4, attention="sdpa", logprob_kernel="full_log_softmax",
        gathered_layers=1, need_ref=True, need_critic=False, autocast=False, entropy_compiled=False,
        ref_offloaded=False,
    )  # fmt: skip


class LiveTrace:
    """The trace, prediction and comparison of the trainer's last step (over the trainer's state)."""

    cfg: VerlConfig
    resolved: Run
    """The config resolved once (``labkit.rules.run``): the sizes, the engine and the prediction take it."""
    sizes: RolloutSizes
    loop: str
    wg: WorkerGroup
    v1: v1_batch.V1Batch | None
    global_steps: int
    lengths: list[int] | None
    trace: StepTrace | None

    def _live_trace(self, order: list[int], mem: dict[str, list[int]], metrics: dict) -> StepTrace:
        """The group's trace of this step plus the driver stages and a ``balance`` record per rank: the rows and
        tokens each rank then received at old_log_prob (dispatch of the reordered batch), with their indices."""
        tr = self.wg.reset_trace()
        N, D = len(order), self.wg.dp_size("actor")
        geo = self.sizes.geo
        tr.stages[:0] = (
            v1_batch.driver_stages(self.v1, geo.prompts, geo.rollout_n, N)
            if self.loop == "v1" and self.v1 is not None
            else [
                StageRecord("dataloader", "dataloader batch", geo.prompts, "prompts"),
                StageRecord("repeat", "repeat for generation", N, "samples"),
            ]
        )
        size = N // D
        tr.stages.append(StageRecord("balance", "union + _balance_batch", N, "samples", size))
        for r in tr.at("old_log_prob"):
            idx = order[r.dp_rank * size : (r.dp_rank + 1) * size]
            tr.ranks.append(
                RankRecord(
                    "balance",
                    r.rank,
                    dp_rank=r.dp_rank,
                    sp_rank=r.sp_rank,
                    rows=r.rows,
                    tokens=r.tokens,
                    extra={"indices": idx},
                )
            )
        for stage in ("reward", "advantage"):
            tr.stages.append(StageRecord(stage, stage, N, "samples", note="driver"))
        for stage, per_rank in mem.items():
            for r in tr.at(stage):
                if r.bytes_measured is None:  # no allocator measurement (measure_memory off): the process's peak RSS
                    r.bytes_measured = per_rank[r.rank]
                r.extra["peak_rss_bytes"] = per_rank[r.rank]
        fill_bytes_predicted(tr, self.resolved, live_memory_settings(self.resolved), LIVE_MEMORY_PHASES)
        tr.summary.update(
            metrics=dict(metrics),
            global_step=self.global_steps,
            lengths=list(self.lengths or []),
            order=list(order),
            sizes=self.sizes.as_dict(),
            loop=self.loop,
        )
        if self.loop == "v1" and self.v1 is not None:
            tr.summary.update(
                agent_loop={"prompts_per_worker": self.v1.prompts_per_worker},
                completion_order=list(self.v1.completion_order),
                end_steps=list(self.v1.end_steps),
                v1_padding={"padding_rows": self.v1.padding_rows, "rows": N},
            )
        return tr

    def prediction(self) -> StepTrace:
        """``plan(cfg, lengths)`` for the last step: the same config, the observed prompt+response lengths in
        generation order (the planner balances them itself)."""
        if self.lengths is None:
            raise RuntimeError("call step() first: the prediction uses the step's observed lengths")
        order = self.v1.completion_order if self.loop == "v1" and self.v1 is not None else None
        tr = plan(self.resolved, lengths=self.lengths, completion_order=order)
        return fill_bytes_predicted(tr, self.resolved, live_memory_settings(self.resolved), LIVE_MEMORY_PHASES)

    def mismatches(self, stages: Sequence[str] = COMPARED, fields: Sequence[str] = FIELDS) -> list[str]:
        """trace.compare(prediction, live trace) on ``stages`` (those present): [] when they agree."""
        from labkit.trace import compare

        if self.trace is None:
            raise RuntimeError("call step() first")
        present = [x for x in stages if self.trace.at(x)]
        return [str(m) for m in compare(self.prediction(), self.trace, stages=present, fields=fields)]
