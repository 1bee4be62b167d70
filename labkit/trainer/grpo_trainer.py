"""One or more GRPO steps live on a worker group, in verl's order, with verl's metric names and a live trace.

``GRPOTrainer`` starts one group of hybrid-engine workers (``labkit.rl.hybrid_worker.ActorRolloutRefWorker``: actor,
reference and rollout colocated on the same ranks, as verl's default) and runs, per ``step()``: gen → balance →
reward → old_log_prob → ref (KL loss or KL in reward) → adv (``labkit.rl.reward.apply_kl_penalty`` first when
``algorithm.use_kl_in_reward``) → update_actor → update_weights, timing each stage as ``timing_s/<name>``. With the
vLLM engine, the step also logs verl's ``training/rollout_probs_diff_*`` (``labkit.rl.rollout_metrics``).
``trace`` is the live StepTrace of the last step (every rank's rows, tokens, padded tokens, micro-batches,
collectives and peak memory per stage); ``prediction()`` is ``plan()`` for the same config and lengths (both in
``labkit.trainer.live_trace``). With ``trainer.use_v1=true`` (engine) the step is verl 0.9.1's v1 loop
(``labkit.trainer.v1_batch``: agent-loop sessions, completion order, padding rows, always-on balance) and the
prediction gets the live completion order; the stages up to the balanced batch are ``labkit.trainer.step_rollout``.
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

from labkit.config.keys import ARR
from labkit.config.verl_config import VerlConfig, load_config
from labkit.protocol.data_proto import DataProto
from labkit.rl import actor_client, rollout
from labkit.rl.algo import agg_loss, grpo_outcome_advantage
from labkit.rl.hybrid_worker import ActorRolloutRefWorker, settings_for
from labkit.rl.reward import apply_kl_penalty, kl_controller_from_config, token_level_scores
from labkit.rl.rollout_metrics import rollout_probs_diff
from labkit.rules.run import Run
from labkit.runtime.worker_group import WorkerGroup
from labkit.trace import StepTrace
from labkit.trainer import engine_setup, v1_batch
from labkit.trainer.live_config import DEFAULT_OVERRIDES as ROLLOUT_DEFAULTS
from labkit.trainer.live_config import sizes
from labkit.trainer.live_trace import LiveTrace
from labkit.trainer.step_metrics import _Progress, data_metrics, sync_metrics
from labkit.trainer.step_rollout import StepRollout

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


def trainer_config(cfg: VerlConfig | Sequence[str] | None = None, profile: str = "engine") -> VerlConfig:
    """A VerlConfig as is, or the small CPU GRPO defaults (8 prompts × n=4 on 4 ranks, mini 8, micro 4) + overrides.
    Engine defaults say ``trainer.use_v1=false`` (verl 0.9.1's v0 loop, RayPPOTrainer.fit); pass
    ``trainer.use_v1=true`` for the v1 loop (PPOTrainer)."""
    if isinstance(cfg, VerlConfig):
        return cfg
    loop = ["trainer.use_v1=false"] if profile == "engine" else []
    return load_config(overrides=[*DEFAULT_OVERRIDES, *loop, *(cfg or [])], profile=profile)


class GRPOTrainer(StepRollout, LiveTrace):
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
        self.resolved = Run.resolve(trainer_config(cfg))  # read once: the sizes, the engine and the prediction take it
        self.cfg = self.resolved.config
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
        self.sizes = s = sizes(self.resolved)
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
        roll = engine_setup.rollout_kwargs(self.resolved)
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

    def _entropy_horizon(self, batch: DataProto) -> int | None:
        """loss_scale_factor of the driver's actor/entropy: v1 pads its nested responses to the step's longest one,
        so seq-mean-token-sum-norm without a factor divides by that (v0: response_length, the tensor width)."""
        factor = self.settings.loss_scale_factor
        if self.loop != "v1" or factor is not None or self.settings.loss_agg_mode != "seq-mean-token-sum-norm":
            return factor
        width = batch.batch["responses"].shape[1]
        return int(batch.batch["attention_mask"][:, -width:].sum(-1).max())

    def run(self, steps: int) -> list[dict[str, Any]]:
        """``steps`` GRPO steps; the metrics of each."""
        return [self.step() for _ in range(steps)]


def mean_scores(history: Sequence[dict]) -> list[float]:
    """critic/score/mean per step of a history (the reward curve)."""
    return [float(np.round(h["critic/score/mean"], 6)) for h in history]
