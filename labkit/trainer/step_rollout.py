"""The first stages of a live GRPO step, up to the balanced batch: v0 (driver repeat, generate, ``_balance_batch``
when trainer.balance_batch) and v1 (agent-loop sessions, completion order, padding rows, the always-on KK balance).
The ``StepRollout`` half of ``labkit.trainer.grpo_trainer.GRPOTrainer``. Mirrors verl/trainer/ppo/ray_trainer.py:
RayPPOTrainer.fit (gen, balance) and v1/trainer_base.py: PPOTrainer._step_once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from labkit.balance.balance_batch import balance_batch
from labkit.config.verl_config import VerlConfig
from labkit.protocol.data_proto import DataProto
from labkit.rl import rollout
from labkit.runtime.worker_group import WorkerGroup
from labkit.trainer import v1_batch
from labkit.trainer.live_config import RolloutSizes
from labkit.trainer.step_metrics import _Progress


class StepRollout:
    """Generate and balance over the trainer's group; ``_timer`` is the trainer's stage timer."""

    cfg: VerlConfig
    sizes: RolloutSizes
    wg: WorkerGroup
    seed: int
    global_steps: int
    tokenizer: Any
    lengths: list[int] | None
    v1: v1_batch.V1Batch | None
    _timer: Callable[[str, dict[str, float], _Progress], AbstractContextManager[None]]

    def _generate(self, prompts: DataProto, n: int) -> DataProto:
        s = self.sizes
        return rollout.generate(
            self.wg,
            prompts,
            n,
            do_sample=s.do_sample,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            response_length=s.geo.response_length,
            seed=self.seed * 1_000_003 + self.global_steps,
        )

    def _v0_rollout(self, prompts: DataProto, timing: dict, bar: _Progress, metrics: dict) -> tuple:
        """v0: driver repeat (interleaved), generate, ``_balance_batch`` when trainer.balance_batch."""
        with self._timer("gen", timing, bar):
            batch = self._generate(prompts, self.sizes.geo.rollout_n)
            gen_metrics = batch.meta_info.pop("metrics", [])
        self.lengths = batch.batch["attention_mask"].sum(-1).tolist()
        order = list(range(len(batch)))
        with self._timer("balance", timing, bar):
            if self.cfg.get("trainer.balance_batch"):
                res = balance_batch(self.lengths, self.wg.dp_size("actor"))
                order = res.global_idx
                batch.reorder(torch.tensor(order))
                metrics.update(res.metrics)
        return batch, order, gen_metrics

    def _v1_rollout(self, prompts: DataProto, timing: dict, bar: _Progress, metrics: dict) -> tuple:
        """v1 (PPOTrainer._step_once): n sessions per prompt inside its agent-loop worker, rows in completion order,
        synthetic padding rows to the required multiple, then the always-on KK balance (ascending index)."""
        geo = self.sizes.geo
        with self._timer("gen", timing, bar):
            rows, split = v1_batch.sessions(prompts, geo.rollout_n, geo.agent_workers)
            batch = self._generate(rows, 1)
            gen_metrics = batch.meta_info.pop("metrics", [])
        self.lengths = batch.batch["attention_mask"].sum(-1).tolist()  # submission order p·n + session
        ends = batch.batch["response_mask"].sum(-1).tolist()
        done = v1_batch.completion_order(ends, batch.non_tensor_batch["agent_worker"])
        batch.reorder(torch.tensor(done))
        batch = v1_batch.add_padding_rows(
            batch, geo.padding_rows, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        )
        with self._timer("balance", timing, bar):
            parts, seqlen = v1_batch.balance(batch.batch["attention_mask"].sum(-1).tolist(), self.wg.dp_size("actor"))
            order = [i for part in parts for i in part]
            batch.reorder(torch.tensor(order))
            metrics.update(seqlen)
        batch.meta_info["loss_horizon"] = "micro_batch"  # seq-mean-token-sum-norm: v1's per-micro-batch horizon
        self.v1 = v1_batch.V1Batch(split, done, [int(x) for x in ends], geo.padding_rows, parts, seqlen)
        return batch, order, gen_metrics
