"""The batch geometry of one RL step, derived once from a config and its profile, and the size rules it rests on.

Every layer reads sizes from here: validate, the planner, the live actor and the trainer. The names are verl's:
B prompts per step (``data.gen_batch_size``, else ``data.train_batch_size``), n samples per prompt, W GPUs, the
actor's Ulysses size sp, D = W // sp data-parallel ranks, the rollout mesh (dp, infer_tp, infer_pp) with
infer_tp = tp·rollout dp (``ActorRolloutRefWorker._build_rollout``) and R = W // (infer_tp·infer_pp) replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from labkit.config.keys import ARR
from labkit.config.lengths import resolve_lengths
from labkit.rules.parallel_layout import FSDP, ParallelLayout
from labkit.rules.v1_loop import (
    SYNTHETIC_PADDING_SEQ_LEN,
    actor_updates_at,
    loop_of,
    padding_rows,
    required_batch_multiple,
)

WORKLOAD_LINEAR = 24576  # verl's calculate_workload: 24576·L + L², the linear term sized for a 7B model (h = 4096)
MAX_PLANNED_SAMPLES = 2**20  # B·n the planner follows row by row (seconds on 2 cores at the limit)
MAX_PLANNED_RANKS = 4096  # GPUs the planner follows rank by rank (about 4 s)


def ceil_div(a: int, b: int) -> int:
    """⌈a / b⌉ for positive b."""
    return -(a // -b)


def ulysses_padded(tokens: int, sp: int) -> int:
    """Packed tokens after ``ulysses_pad``: round up to a multiple of sp (pad = (sp - nnz % sp) % sp)."""
    return ceil_div(tokens, sp) * sp


def workload(length: int) -> int:
    """One row's balancing workload, 24576·L + L². Mirrors verl/utils/seqlen_balancing.py: calculate_workload."""
    return WORKLOAD_LINEAR * length + length * length


def dataloader_batch_size(get: Callable[[str], Any]) -> int:
    """B: the dataloader's prompts per step, ``data.gen_batch_size`` when set, else ``data.train_batch_size``."""
    return get("data.gen_batch_size") or get("data.train_batch_size")


def dp_size_of(world_size: int, sp: int) -> int:
    """D = W // sp, or 0 when sp does not divide W (torch cannot build the (dp, sp) mesh: X4)."""
    return world_size // sp if world_size % sp == 0 else 0


def rollout_replicas_of(world_size: int, infer_tp: int, infer_pp: int) -> int:
    """R = W // (infer_tp·infer_pp) rollout replicas, or 0 when the rollout mesh does not tile W (E23)."""
    size = infer_tp * infer_pp
    return world_size // size if world_size % size == 0 else 0


def legacy_normalized_mini(mini_batch_size: int, rollout_n: int, world_size: int, sp: int) -> int:
    """M′ = (M·n) // (W // sp): the legacy worker's per-rank mini-batch, before its E20–E22 asserts.
    Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker.__init__ / CriticWorker.__init__ (≤ 0.7)."""
    return (mini_batch_size * rollout_n) // (world_size // sp)


@dataclass(frozen=True)
class BatchGeometry:
    """The sizes of one training step (``from_config``); each field is one of verl's quantities."""

    profile: str
    """``legacy`` (verl ≤ 0.7 workers) or ``engine`` (verl 0.9.1 engine workers)."""
    train_batch_size: int
    """``data.train_batch_size``: prompts per training step."""
    prompts: int
    """B, the dataloader batch: ``data.gen_batch_size`` when set, else ``data.train_batch_size``."""
    rollout_n: int
    """n, ``rollout.n``: samples generated per prompt."""
    samples: int
    """N, the rows of the step's training batch: B·n (legacy, v0: the driver's repeat); B·n + synthetic padding rows
    (v1: ``generated_samples + padding_rows``)."""
    world_size: int
    """W = ``trainer.n_gpus_per_node`` × ``trainer.nnodes``."""
    ulysses_sp: int
    """sp, the actor's ``ulysses_sequence_parallel_size``."""
    dp_size: int
    """D = W // sp data-parallel ranks of the actor (0 when sp does not divide W)."""
    rollout_tp: int
    """``rollout.tensor_model_parallel_size``."""
    rollout_dp: int
    """``rollout.data_parallel_size`` (folded into the inference TP size)."""
    rollout_pp: int
    """``rollout.pipeline_model_parallel_size`` (infer_pp)."""
    infer_tp: int
    """tp·rollout dp: the rollout mesh's TP dimension."""
    rollout_replicas: int
    """R = W // (infer_tp·infer_pp) rollout engines (0 when the mesh does not tile W)."""
    agent_workers: int
    """A, ``rollout.agent.num_workers``: agent-loop workers the samples are split over."""
    prompt_length: int
    """``rollout.prompt_length``: padded prompt width."""
    response_length: int
    """``rollout.response_length``: padded response width."""
    width: int
    """prompt_length + response_length: the padded row width, the longest a sample can be."""
    remove_padding: bool
    """The actor's ``use_remove_padding`` (``model.`` in the engine profile, ``actor.`` in legacy)."""
    ppo_epochs: int
    """The larger of the actor's and the critic's ``ppo_epochs``: passes over the batch in an update."""
    loop: str = "v0"
    """The trainer loop (``labkit.rules.v1_loop.loop_of``): legacy, v0 (``trainer.use_v1=false``) or v1."""
    generated_samples: int = 0
    """B·n trajectories the rollout produces (equal to ``samples`` outside v1)."""
    required_multiple: int | None = None
    """v1: lcm(D, critic M·n, actor M·n) that the batch is padded to (``_get_required_batch_multiple``), else None."""
    padding_rows: int = 0
    """v1: synthetic padding rows appended before balancing (128 tokens, zero loss mask each), else 0."""
    global_step: int = 1
    """The trainer's ``global_steps`` this geometry is for (1 = the first step; the actor updates from step
    ``trainer.critic_warmup`` on, and v1's padding multiple follows)."""
    failed_sessions: tuple[int, ...] = ()
    """v1: the trajectories (p·n + session) whose agent-loop session failed: they write no row; the sync replay
    buffer keeps their group's survivors and padding makes up the rest."""
    critic_warmup: int = 0
    """``trainer.critic_warmup``: the first global step with an actor update."""
    budget_cap: bool = True
    """The engine's dynamic token budget is a hard cap (verl 0.9.1) or only sets the micro-batch count (0.8.0, 0.9.0,
    as the legacy workers); ``labkit.config.versions``."""
    padding_row_tokens: int = SYNTHETIC_PADDING_SEQ_LEN
    """Tokens of one synthetic v1 padding row (0.9.1: 128; 0.9.0: 2)."""
    layout: ParallelLayout | None = None
    """The training engine's parallel layout (FSDP: DP × Ulysses SP; Megatron: TP × CP × EP × DP × PP), read once
    with the geometry; ``dp_size`` is its trainer-facing DP size."""

    agent_loop: bool = True
    """The rollout goes through the agent loop (``rollout.mode: async``; verl's default from 0.7): B·n requests
    chunked equally over A workers. Up to 0.6 the default ``sync`` mode generates on the DP ranks directly."""

    @property
    def parallel(self) -> ParallelLayout:
        """The layout, or the FSDP layout of these sizes when the geometry was built by hand."""
        return self.layout or ParallelLayout(FSDP, self.world_size, ulysses_sp=self.ulysses_sp)

    @property
    def survivors(self) -> int:
        """The trajectories that reach the batch: B·n less the failed sessions."""
        return self.generated_samples - len(self.failed_sessions)

    @property
    def actor_updates(self) -> bool:
        """Whether the actor updates at this step (``critic_warmup <= global_steps``, both loops)."""
        return actor_updates_at(self.critic_warmup, self.global_step)

    def too_large_to_plan(self) -> str | None:
        """Why the planner will not follow this step row by row and rank by rank (None when it will), with the
        arithmetic it still knows."""
        if (
            self.samples <= MAX_PLANNED_SAMPLES
            and self.world_size <= MAX_PLANNED_RANKS
            and self.samples * self.ppo_epochs <= MAX_PLANNED_SAMPLES * 16
        ):
            return None
        if self.samples <= MAX_PLANNED_SAMPLES and self.world_size <= MAX_PLANNED_RANKS:
            return (
                f"too large to plan per rank: ppo_epochs = {self.ppo_epochs:,} passes over {self.samples:,} "
                f"samples; the planner follows at most {MAX_PLANNED_SAMPLES * 16:,} sample-passes per update."
            )
        per_rank = f", {self.samples // self.dp_size:,} rows per DP rank" if self.dp_size else ""
        pad = (
            f" + {self.padding_rows:,} v1 padding rows (multiple {self.required_multiple:,})"
            if self.padding_rows
            else ""
        )
        return (
            f"too large to plan per rank: B·n = {self.prompts:,}·{self.rollout_n:,}{pad} = {self.samples:,} samples "
            f"over W = {self.world_size:,} GPUs (D = {self.dp_size:,}{per_rank}); the planner follows at most "
            f"{MAX_PLANNED_SAMPLES:,} samples and {MAX_PLANNED_RANKS:,} GPUs."
        )

    def lengths(self, spec: Sequence[int] | str | None, seed: int = 0) -> list[int] | None:
        """One length per generated sample, B·n (``labkit.config.lengths.resolve_lengths`` with B, n and the widths);
        v1's synthetic padding rows are not included (``v1_lengths`` appends them)."""
        return resolve_lengths(
            spec,
            n_prompts=self.prompts,
            n=self.rollout_n,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            seed=seed,
        )

    @classmethod
    def from_config(cls, cfg: Any, global_step: int = 1, failed_sessions: Sequence[int] = ()) -> BatchGeometry:
        """Read every size from ``cfg`` (a ``labkit.config.verl_config.VerlConfig``), once, for global step
        ``global_step`` with the v1 sessions ``failed_sessions`` (trajectory indices) failed. ValueError for a step
        below 1 or failed sessions outside the v1 loop or outside 0..B·n-1."""
        g = cfg.get
        layout = ParallelLayout.from_config(cfg)
        n, world, sp = g(f"{ARR}.rollout.n"), cfg.n_gpus, layout.ulysses_sp
        tp, rdp, pp = (g(f"{ARR}.rollout.{k}_parallel_size") for k in ("tensor_model", "data", "pipeline_model"))
        prompts, pl, rl = (
            dataloader_batch_size(g),
            g(f"{ARR}.rollout.prompt_length"),
            g(f"{ARR}.rollout.response_length"),
        )
        rmpad = g(f"{ARR}.{'model' if cfg.profile == 'engine' else 'actor'}.use_remove_padding")
        loop = loop_of(cfg.profile, cfg.profile == "engine" and g("trainer.use_v1"))
        D = layout.trainer_dp_size
        multiple, pad = None, 0
        if global_step < 1:
            raise ValueError(f"global_step must be 1 or more (verl's first step is 1), got {global_step}")
        failed = tuple(sorted({int(i) for i in failed_sessions}))
        if failed and loop != "v1":
            raise ValueError("failed sessions are modelled for the v1 loop's replay buffer only (trainer.use_v1=true)")
        warmup = g("trainer.critic_warmup")
        if loop == "v1":  # v1 fetches train_batch_size prompts per step (gen_batch_size only sizes the fetches)
            prompts = g("data.train_batch_size")
            if failed and (failed[0] < 0 or failed[-1] >= prompts * n):
                raise ValueError(f"failed sessions must be trajectory indices 0..B·n-1 = 0..{prompts * n - 1}")
            if D:
                critic = g("critic.ppo_mini_batch_size") if cfg.need_critic else None
                actor = g(f"{ARR}.actor.ppo_mini_batch_size")
                multiple = required_batch_multiple(D, n, actor, critic, warmup, global_step)
                pad = padding_rows(prompts * n - len(failed), multiple) if prompts * n > len(failed) else 0
        return cls(
            profile=cfg.profile,
            train_batch_size=g("data.train_batch_size"),
            prompts=prompts,
            rollout_n=n,
            samples=prompts * n - len(failed) + pad,
            world_size=world,
            ulysses_sp=sp,
            dp_size=D,
            rollout_tp=tp,
            rollout_dp=rdp,
            rollout_pp=pp,
            infer_tp=tp * rdp,
            rollout_replicas=rollout_replicas_of(world, tp * rdp, pp),
            agent_workers=g(f"{ARR}.rollout.agent.num_workers"),
            agent_loop=uses_agent_loop(cfg),
            prompt_length=pl,
            response_length=rl,
            width=pl + rl,
            remove_padding=bool(rmpad),
            ppo_epochs=max(g(f"{ARR}.actor.ppo_epochs"), g("critic.ppo_epochs")),
            loop=loop,
            generated_samples=prompts * n,
            required_multiple=multiple,
            padding_rows=pad,
            global_step=global_step,
            failed_sessions=failed,
            critic_warmup=warmup,
            budget_cap=cfg.release is None or cfg.release.budget_cap,
            padding_row_tokens=SYNTHETIC_PADDING_SEQ_LEN if cfg.release is None else cfg.release.padding_row_tokens,
            layout=layout,
        )


def lengths_for_config(cfg: Any, spec: Sequence[int] | str | None, seed: int = 0) -> list[int] | None:
    """One length per sample of ``cfg``'s step (``BatchGeometry.lengths``)."""
    return BatchGeometry.from_config(cfg).lengths(spec, seed)


def uses_agent_loop(cfg: Any) -> bool:
    """``rollout.mode`` as set, else the release's default: ``sync`` up to 0.6 (``ppo_trainer.yaml``), ``async``
    (the agent loop) from 0.7, and in every profile labkit models without ``--verl``."""
    for table in (cfg.values, cfg.ignored, cfg.added):
        mode = table.get(f"{ARR}.rollout.mode")
        if mode is not None:
            return str(mode).strip() != "sync"
    rel = cfg.release
    return rel is None or rel.version not in ("0.1", "0.2", "0.3", "0.4", "0.5", "0.6")
