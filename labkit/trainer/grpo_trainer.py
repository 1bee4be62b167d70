"""One or more GRPO steps live on a worker group, in verl's order, with verl's metric names and a live trace.

``GRPOTrainer`` starts one group of hybrid-engine workers (``labkit.rl.hybrid_worker.ActorRolloutRefWorker``: actor,
reference and rollout colocated on the same ranks, as verl's default) and runs, per ``step()``: gen → balance →
reward → old_log_prob → ref (KL loss or KL in reward) → adv (``labkit.rl.reward.apply_kl_penalty`` first when
``algorithm.use_kl_in_reward``) → update_actor → update_weights, timing each stage as ``timing_s/<name>``. With the
vLLM engine, the step also logs verl's ``training/rollout_probs_diff_*`` (``labkit.rl.rollout_metrics``).
``trace`` is the live StepTrace of the last step (every rank's rows, tokens, padded tokens, micro-batches,
collectives and peak memory per stage); ``prediction()`` is ``plan()`` for the same config and lengths.
With ``trainer.use_v1=true`` (engine) the step is verl 0.9.1's v1 loop (``labkit.trainer.v1_batch``: agent-loop
sessions, completion order, padding rows, always-on balance) and the prediction gets the live completion order.
Mirrors verl/trainer/ppo/ray_trainer.py: RayPPOTrainer.fit (0.9.1 order), v1/trainer_base.py: PPOTrainer._step_once
and metric_utils.compute_data_metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from labkit.balance.balance_batch import balance_batch
from labkit.config.keys import ARR
from labkit.config.verl_config import VerlConfig, load_config
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import fill_bytes_predicted
from labkit.plan.step import plan
from labkit.protocol.data_proto import DataProto
from labkit.rl import actor_client, rollout
from labkit.rl.algo import agg_loss, grpo_outcome_advantage
from labkit.rl.hybrid_worker import ActorRolloutRefWorker, settings_for
from labkit.rl.reward import apply_kl_penalty, kl_controller_from_config, token_level_scores
from labkit.rl.rollout_metrics import rollout_probs_diff
from labkit.runtime.worker_group import WorkerGroup
from labkit.trace import RankRecord, StageRecord, StepTrace
from labkit.trainer import engine_setup, v1_batch
from labkit.trainer.live_rollout import DEFAULT_OVERRIDES as ROLLOUT_DEFAULTS
from labkit.trainer.live_rollout import sizes
from labkit.trainer.step_metrics import _Progress, data_metrics, sync_metrics

DEFAULT_OVERRIDES = (  # the live rollout's small CPU defaults, plus what a GRPO step needs
    "algorithm.adv_estimator=grpo",
    *ROLLOUT_DEFAULTS,
    f"{ARR}.rollout.agent.num_workers=4",
    f"{ARR}.actor.ppo_mini_batch_size=8",
    f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
    f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=4",
    f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=4",
    f"{ARR}.actor.entropy_coeff=0",
)
RANK_STAGES = ("generate", "old_log_prob", "ref_log_prob", "update_actor")
COMPARED = ("balance", "old_log_prob", "ref_log_prob", "update_actor")
FIELDS = ("rows", "tokens", "padded_tokens", "n_micro", "micro_rows", "micro_tokens", "mini_batches", "collectives")


def trainer_config(cfg: VerlConfig | Sequence[str] | None = None, profile: str = "engine") -> VerlConfig:
    """A VerlConfig as is, or the small CPU GRPO defaults (8 prompts × n=4 on 4 ranks, mini 8, micro 4) + overrides.
    Engine defaults say ``trainer.use_v1=false`` (verl 0.9.1's v0 loop, RayPPOTrainer.fit); pass
    ``trainer.use_v1=true`` for the v1 loop (PPOTrainer)."""
    if isinstance(cfg, VerlConfig):
        return cfg
    loop = ["trainer.use_v1=false"] if profile == "engine" else []
    return load_config(overrides=[*DEFAULT_OVERRIDES, *loop, *(cfg or [])], profile=profile)


LIVE_MEMORY_PHASES = ("old_log_prob", "ref_log_prob", "update_actor")


def live_memory_settings(cfg: VerlConfig) -> MemorySettings:
    """The memory model of labkit's CPU ranks: the tiny shape in fp32, FSDP2 over W ranks (one layer gathered at a
    time), sdpa's dense mask, the PyTorch log-softmax, no autocast and an eager entropy, a reference always built; generate runs the rollout engine
    (its plan: ``labkit.plan.rollout_engine``), so only the FSDP phases are predicted."""
    return MemorySettings.from_config(
        cfg, "tiny-qwen2", 2**40, compute_bytes=4, rollout_bytes=4, attention="sdpa", logprob_kernel="full_log_softmax",
        gathered_layers=1, need_ref=True, need_critic=False, autocast=False, entropy_compiled=False,
        ref_offloaded=False,
    )  # fmt: skip


class GRPOTrainer:
    """A worker group of hybrid-engine ranks for one config; ``step()`` runs one full GRPO step and returns metrics.

    The actor's AdamW learning rate is ``actor_rollout_ref.actor.optim.lr`` of the config unless ``lr`` is given."""

    def __init__(
        self,
        cfg: VerlConfig | Sequence[str] | None = None,
        *,
        launcher: str = "auto",
        seed: int = 0,
        lr: float | None = None,
        progress: bool = True,
        fixed_prompts: bool = False,
        timeout_s: float = 300.0,
        collective_timeout_s: float = 60.0,
        measure_memory: bool = False,
        on_stage: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = trainer_config(cfg)
        if self.cfg.get("algorithm.adv_estimator") != "grpo" or self.cfg.need_critic:
            raise ValueError(
                f"GRPOTrainer runs algorithm.adv_estimator=grpo without a critic, got "
                f"{self.cfg.get('algorithm.adv_estimator')!r}"
            )
        sp, ref_sp = (self.cfg.get(f"{ARR}.{role}.ulysses_sequence_parallel_size") for role in ("actor", "ref"))
        if ref_sp != sp:  # the planner models verl's ref on its own SP size; the live ref shares the actor's
            raise ValueError(
                f"the live trainer runs the reference on the actor's Ulysses groups: "
                f"{ARR}.ref.ulysses_sequence_parallel_size={ref_sp} must equal the actor's {sp} (verl's "
                f"default); labkit.plan.step shows what verl does with a different ref size"
            )
        self.sizes = s = sizes(self.cfg)
        self.loop = s.geo.loop
        if self.loop == "v1" and s.geo.generated_samples % max(s.geo.rollout_replicas, 1):
            raise ValueError(
                f"the live v1 step hands the B·n = {s.geo.generated_samples} sessions to the "
                f"{s.geo.rollout_replicas} rollout replicas in equal consecutive shares (verl's least-in-flight balancer "
                "has no fixed split): B·n must be a multiple of the number of replicas"
            )
        self.v1: v1_batch.V1Batch | None = None
        self.seed, self.progress, self.fixed_prompts, self.on_stage = seed, progress, fixed_prompts, on_stage
        self.kl_ctrl_in_reward = (
            kl_controller_from_config(self.cfg) if self.cfg.get("algorithm.use_kl_in_reward") else None
        )  # RayPPOTrainer.__init__: core_algos.get_kl_controller
        self.settings = settings_for(self.cfg).with_(
            seed=seed, measure_memory=measure_memory, **({} if lr is None else {"lr": float(lr)})
        )
        self.global_steps, self.history = 0, []
        self.trace: StepTrace | None = None
        self.lengths: list[int] | None = None
        self.tokenizer = rollout.load_tokenizer()
        roll = engine_setup.rollout_kwargs(self.cfg)
        self.engine = roll["name"]  # the engine that runs (vllm falls back to hf where it is not installed)
        bar = _Progress(2, "start-up", progress, on_stage)
        bar.stage(f"starting {s.geo.world_size} ranks ({launcher})")
        try:
            self.wg = WorkerGroup(
                ActorRolloutRefWorker,
                s.geo.world_size,
                launcher=launcher,
                timeout_s=timeout_s,
                collective_timeout_s=collective_timeout_s,
                profile=self.cfg.profile,
                init_kwargs=dict(rollout=roll, **self.settings.as_dict()),
                env=engine_setup.rank_env(self.engine),
            )
            bar.advance()
            bar.stage("init_model: load the model, shard it (FSDP2, rollout TP)")
            try:
                self.info = self.wg.init_model()
            except BaseException:
                self.wg.close()
                raise
            bar.advance()
        finally:
            bar.close()
        self.wg.actor_settings = self.settings
        self.wg.reset_trace()

    def __enter__(self) -> GRPOTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> dict[str, Any]:
        """Close the worker group (idempotent); reports the rank processes still alive (must be none)."""
        teardown = self.wg.close()
        return {"left_pids": self.wg.alive_pids(), "teardown": teardown}

    @contextmanager
    def _timer(self, name: str, timing: dict[str, float], bar: _Progress) -> Iterator[None]:
        bar.stage(name)
        t0 = time.perf_counter()
        yield
        timing[name] = time.perf_counter() - t0
        bar.advance()

    def _memory(self) -> list[int]:
        return [m["peak_rss_bytes"] for m in self.wg.peak_memory()]

    def step(self) -> dict[str, Any]:
        """One step: gen → balance → reward → old_log_prob → ref → adv → update_actor → update_weights."""
        s, cfg = self.sizes, self.cfg
        self.global_steps += 1
        use_ref = cfg.need_reference_policy
        metrics: dict[str, Any] = {}
        timing: dict[str, float] = {}
        mem: dict[str, list[int]] = {}
        self.wg.reset_trace()
        bar = _Progress(7 + use_ref, f"GRPO step {self.global_steps}", self.progress, self.on_stage)
        try:
            with self._timer("step", timing, _Progress(0, "", False)):
                data_seed = self.seed if self.fixed_prompts else self.seed * 100_003 + self.global_steps
                prompts = rollout.make_gen_batch(s.geo.prompts, data_seed, s.geo.prompt_length, self.tokenizer)
                if self.loop == "v1":
                    batch, order, gen_metrics = self._v1_rollout(prompts, timing, bar, metrics)
                else:
                    batch, order, gen_metrics = self._v0_rollout(prompts, timing, bar, metrics)
                mem["generate"] = self._memory()
                batch.meta_info.update(
                    temperature=s.temperature, global_token_num=batch.batch["attention_mask"].sum(-1).tolist()
                )
                with self._timer("reward", timing, bar):
                    real = v1_batch.real_rows(batch)  # v1: padding rows score 0 (rm_scores = [0.0])
                    scores = torch.zeros(batch.batch["responses"].shape, dtype=torch.float32)
                    scores[real] = token_level_scores(batch.select_idxs(real), self.tokenizer)[0]
                    batch.batch["token_level_scores"] = scores
                with self._timer("old_log_prob", timing, bar):
                    old = actor_client.compute_log_prob(self.wg, batch)
                    ent = old.batch["entropys"]
                    metrics["actor/entropy"] = float(
                        agg_loss(
                            ent,
                            batch.batch["response_mask"],
                            self.settings.loss_agg_mode,
                            profile=cfg.profile,
                            loss_scale_factor=self._entropy_horizon(batch),
                        )
                    )
                    old.pop(batch_keys=["entropys"])
                    batch.union(old)
                    if "rollout_log_probs" in batch.batch.keys():  # the engine's log-probs vs the actor's
                        metrics.update(rollout_probs_diff(batch))
                mem["old_log_prob"] = self._memory()
                if use_ref:
                    with self._timer("ref", timing, bar):
                        batch.union(actor_client.compute_ref_log_prob(self.wg, batch))
                    mem["ref_log_prob"] = self._memory()
                with self._timer("adv", timing, bar):
                    b = batch.batch
                    if self.kl_ctrl_in_reward is not None:  # ray_trainer.fit: apply_kl_penalty before the advantage
                        b["token_level_rewards"], kl_metrics = apply_kl_penalty(
                            b["token_level_scores"],
                            b["old_log_probs"],
                            b["ref_log_prob"],
                            b["response_mask"],
                            self.kl_ctrl_in_reward,
                            cfg.get("algorithm.kl_penalty"),
                            profile=cfg.profile,
                        )
                        metrics.update(kl_metrics)
                    else:
                        b["token_level_rewards"] = b["token_level_scores"]
                    adv, ret = grpo_outcome_advantage(
                        batch.batch["token_level_rewards"],
                        batch.batch["response_mask"],
                        batch.non_tensor_batch["uid"],
                        norm_adv_by_std_in_grpo=cfg.get("algorithm.norm_adv_by_std_in_grpo"),
                    )
                    batch.batch["advantages"], batch.batch["returns"] = adv, ret
                with self._timer("update_actor", timing, bar):
                    metrics.update(actor_client.update_actor(self.wg, batch))
                mem["update_actor"] = self._memory()
                with self._timer("update_weights", timing, bar):
                    self.synced = self.wg.update_weights()
                metrics.update(sync_metrics(self.synced))
        finally:
            bar.close()
        kept = batch.select_idxs(v1_batch.real_rows(batch))  # v1: data metrics leave the padding rows out
        metrics.update(data_metrics(kept, s.geo.response_length, s.geo.prompt_length, cfg.profile))
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        tokens = int(sum(batch.meta_info["global_token_num"]))
        metrics.update(
            {
                "perf/total_num_tokens": tokens,
                "perf/time_per_step": timing["step"],
                "perf/throughput": tokens / (timing["step"] * s.geo.world_size),
                "training/global_step": self.global_steps,
            }
        )
        self.batch, self.order, self.gen_metrics = batch, order, gen_metrics
        self.trace = self._live_trace(order, mem, metrics)
        self.history.append(metrics)
        return metrics

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

    def _entropy_horizon(self, batch: DataProto) -> int | None:
        """loss_scale_factor of the driver's actor/entropy: v1 pads its nested responses to the step's longest one,
        so seq-mean-token-sum-norm without a factor divides by that (v0: response_length, the tensor width)."""
        factor = self.settings.loss_scale_factor
        if self.loop != "v1" or factor is not None or self.settings.loss_agg_mode != "seq-mean-token-sum-norm":
            return factor
        width = batch.batch["responses"].shape[1]
        return int(batch.batch["attention_mask"][:, -width:].sum(-1).max())

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
        fill_bytes_predicted(tr, self.cfg, live_memory_settings(self.cfg), LIVE_MEMORY_PHASES)
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
        tr = plan(self.cfg, lengths=self.lengths, completion_order=order)
        return fill_bytes_predicted(tr, self.cfg, live_memory_settings(self.cfg), LIVE_MEMORY_PHASES)

    def mismatches(self, stages: Sequence[str] = COMPARED, fields: Sequence[str] = FIELDS) -> list[str]:
        """trace.compare(prediction, live trace) on ``stages`` (those present): [] when they agree."""
        from labkit.trace import compare

        if self.trace is None:
            raise RuntimeError("call step() first")
        present = [x for x in stages if self.trace.at(x)]
        return [str(m) for m in compare(self.prediction(), self.trace, stages=present, fields=fields)]

    def run(self, steps: int) -> list[dict[str, Any]]:
        """``steps`` GRPO steps; the metrics of each."""
        return [self.step() for _ in range(steps)]


def mean_scores(history: Sequence[dict]) -> list[float]:
    """critic/score/mean per step of a history (the reward curve)."""
    return [float(np.round(h["critic/score/mean"], 6)) for h in history]
