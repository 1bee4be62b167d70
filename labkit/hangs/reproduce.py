"""verl's four batch-size hangs reproduced on 2 real ranks, each ended by a short collective timeout and diagnosed;
and the same run with the one-line fix, whose collective counts must equal the planner's.

(a) ``unsynced_dynamic_bsz``: dynamic micro-batches without the DP MAX sync (#5750, fixed by PR #5591);
(b) ``light_rank_assert``: the sync succeeds, a light rank fails its own assert while its peer waits (EasyR1 #11004);
(c) ``split_zero``: a micro size normalised to 0 (legacy ``split(0)``, #12, #2490), the loop bounded by the lab;
(d) ``tp_all_gather``: the ≤ v0.5 TP all-gather of generation inputs with unequal rows per rank (#12).
Every run uses the local launcher and closes its group; ``left_pids`` lists rank processes still alive (none).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from labkit.config.keys import ARR
from labkit.config.verl_config import load_config
from labkit.hangs.diagnosis import Diagnosis, diagnose, timeline
from labkit.hangs.worker import HangWorker
from labkit.plan.hang_risk import FIX, stage_budgets, unsynced_counts
from labkit.plan.step import plan
from labkit.runtime.worker_group import WorkerGroup

WORLD = 2
BUDGET = 4096  # rollout.log_prob_max_token_len_per_gpu of (a) and (b)
HEAVY, LIGHT = [3000] * 4, [1000] * 4  # dp_rank 0 and dp_rank 1 (balance off): k alone 3 and 1
BASE = (
    f"trainer.n_gpus_per_node={WORLD}",
    "algorithm.adv_estimator=grpo",
    "trainer.balance_batch=false",
    "data.max_prompt_length=1024",
    "data.max_response_length=3072",
    f"{ARR}.actor.ppo_mini_batch_size=4",
    f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
    f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=2",
)


@dataclass
class FixedRun:
    """The run with the fix: it completed on every rank, and its collective counts next to the planner's."""

    completed: bool
    observed: dict[int, dict[str, int]]
    predicted: dict[int, dict[str, int]]
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mismatches(self) -> list[str]:
        return [
            f"rank {r}: predicted {self.predicted.get(r)}, observed {self.observed.get(r)}"
            for r in sorted(set(self.observed) | set(self.predicted))
            if self.observed.get(r) != self.predicted.get(r)
        ]


@dataclass
class HangRun:
    """One reproduction: the diagnosis, each rank's record, the timeline, the time it took, what was left behind."""

    diagnosis: Diagnosis
    results: list[dict[str, Any]]
    events: list[dict[str, Any]]
    elapsed_s: float
    timeout_s: float
    left_pids: list[int]
    fixed: FixedRun | None = None


def run_ranks(method: str, *args: Any, tp: int = 1, timeout_s: float = 3.0, **kwargs: Any) -> tuple[list, list, float]:
    """Start WORLD HangWorker ranks (local launcher, collective timeout ``timeout_s``), run one method on every
    rank, close the group. Returns (per-rank records, rank pids still alive, seconds)."""
    t0 = time.monotonic()
    wg = WorkerGroup(
        HangWorker,
        WORLD,
        launcher="local",
        init_kwargs={"tp": tp},
        collective_timeout_s=timeout_s,
        timeout_s=4 * timeout_s + 30.0,
        start_timeout_s=60.0,
    )
    try:
        results = wg.call(method, *args, **kwargs)
    finally:
        wg.close()
    return list(results), wg.alive_pids(), time.monotonic() - t0


def _config(*overrides: str, profile: str = "legacy") -> Any:
    """The lab's config; under ``engine`` the v0 loop, whose rows reach the ranks as the lab dispatches them."""
    loop = ["trainer.use_v1=false"] if profile == "engine" else []
    return load_config(overrides=[*BASE, *loop, *overrides], profile=profile)


def _dp_lengths(trace: Any, lengths: list[int]) -> list[list[int]]:
    """Lengths each DP rank receives in the planned step (the planner's balance stage)."""
    return [[lengths[i] for i in r.extra["indices"]] for r in trace.at("balance") if not r.sp_rank]


def _fixed(results: list[dict], trace: Any, stage: str) -> FixedRun:
    return FixedRun(
        completed=all(r["outcome"] == "ok" for r in results),
        observed={r["rank"]: r["counts"] for r in results},
        predicted={r.rank: dict(r.collectives) for r in trace.at(stage)},
        results=results,
    )


def dynamic_config(profile: str = "legacy", budget: int = BUDGET, *extra: str) -> Any:
    """4 prompts × n=2 on 2 GPUs, old log-prob with dynamic micro-batches under ``budget`` tokens per GPU."""
    return _config(
        "data.train_batch_size=4",
        f"{ARR}.rollout.n=2",
        f"{ARR}.rollout.log_prob_use_dynamic_bsz=true",
        f"{ARR}.rollout.log_prob_max_token_len_per_gpu={budget}",
        *extra,
        profile=profile,
    )


def fixed_dynamic_run(cfg: Any, lengths: list[int], timeout_s: float = 3.0, update: bool = False) -> FixedRun:
    """The live dynamic stage with the MAX sync on the lengths the planner dispatches; counts vs ``plan``."""
    stage = "update_actor" if update else "old_log_prob"
    trace = plan(cfg, lengths)
    budgets, width = stage_budgets(cfg)
    budget, width = budgets[stage], width if cfg.profile == "legacy" else None
    results, _, _ = run_ranks(
        "micro_batch_stage",
        _dp_lengths(trace, lengths),
        budget,
        profile=cfg.profile,
        sync=True,
        stage=stage,
        update=update,
        width=width,
        timeout_s=timeout_s,
    )
    return _fixed(results, trace, stage)


def trace_width(cfg: Any) -> int:
    """The rollout's padded width (prompt + response length): legacy's E31 compares the budget to it."""
    return stage_budgets(cfg)[1]


def unsynced_dynamic_bsz(timeout_s: float = 3.0, fix: bool = True) -> HangRun:
    """(a): rank 0 holds 4 rows of 3000 tokens, rank 1 4 of 1000, budget 4096; without the MAX sync rank 0 cuts 3
    micro-batches, rank 1 cuts 1, so rank 0's second parameter all-gather has no partner."""
    per_rank = [HEAVY, LIGHT]
    cfg = dynamic_config()
    results, left, elapsed = run_ranks(
        "micro_batch_stage", per_rank, BUDGET, sync=False, width=trace_width(cfg), timeout_s=timeout_s
    )
    alone = unsynced_counts(per_rank, BUDGET, "legacy", trace_width(cfg))
    diag = diagnose(
        "a",
        "dynamic batch size without the DP MAX sync",
        results,
        FIX["a"],
        f"micro-batches per rank without the sync {alone}",
    )
    run = HangRun(diag, results, timeline(results), elapsed, timeout_s, left)
    if fix:
        run.fixed = fixed_dynamic_run(cfg, HEAVY + LIGHT, timeout_s)
    return run


def light_rank_assert(timeout_s: float = 3.0, fix: bool = True) -> HangRun:
    """(b): unequal rows (as a fork dispatches them): rank 0 has 4 rows of 3000, rank 1 only 2 of 1000; the MAX sync
    gives k = 3 > 2 rows, rank 1 fails ``assert num_micro_batches <= num_groups``, rank 0 waits in its all-gather."""
    per_rank = [HEAVY, LIGHT[:2]]
    width = trace_width(dynamic_config())
    results, left, elapsed = run_ranks(
        "micro_batch_stage", per_rank, BUDGET, sync=True, width=width, timeout_s=timeout_s
    )
    synced = max(unsynced_counts(per_rank, BUDGET, "legacy", width))
    diag = diagnose(
        "b",
        "a light rank fails its own assert after the MAX sync",
        results,
        FIX["b"],
        f"synced k = {synced}, rows per rank {[len(x) for x in per_rank]}",
    )
    run = HangRun(diag, results, timeline(results), elapsed, timeout_s, left)
    if fix:
        fixed, _, _ = run_ranks(
            "micro_batch_stage", per_rank, BUDGET, sync=True, width=width, pad_light=True, timeout_s=timeout_s
        )
        predicted = {"all_reduce(max):num_micro_batches": 1, "all_gather(params)": synced}
        run.fixed = FixedRun(
            completed=all(r["outcome"] == "ok" for r in fixed),
            observed={r["rank"]: r["counts"] for r in fixed},
            predicted={r: dict(predicted) for r in range(WORLD)},
            results=fixed,
        )
    return run


def split_zero(timeout_s: float = 3.0, fix: bool = True, max_s: float = 1.5) -> HangRun:
    """(c): legacy ``rollout.log_prob_micro_batch_size=1`` (deprecated, global) on 2 GPUs normalises to 1 // 2 = 0;
    every rank loops in ``split(0)`` with memory climbing; the lab stops the loop after ``max_s`` seconds."""
    cfg = _config(
        "data.train_batch_size=4",
        f"{ARR}.rollout.n=2",
        f"{ARR}.rollout.log_prob_micro_batch_size=1",
        f"~{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
    )
    rows = cfg.get("data.train_batch_size") * cfg.get(f"{ARR}.rollout.n") // WORLD
    micro = cfg.get(f"{ARR}.rollout.log_prob_micro_batch_size") // WORLD  # verl's legacy normalisation: 1 // 2
    results, left, elapsed = run_ranks("static_stage", rows, micro, max_s=max_s, timeout_s=timeout_s)
    rate = max(r.get("bytes_per_s", 0.0) for r in results)
    diag = diagnose(
        "c",
        "a micro size normalised to 0 (split(0))",
        results,
        FIX["c"],
        f"micro size {micro} per GPU; memory climbs about {rate / 2**20:.0f} MiB/s per rank until OOM",
    )
    run = HangRun(diag, results, timeline(results), elapsed, timeout_s, left)
    if fix:
        good = _config(
            "data.train_batch_size=4", f"{ARR}.rollout.n=2", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=2"
        )
        trace = plan(good)
        fixed, _, _ = run_ranks(
            "static_stage", rows, good.get(f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu"), timeout_s=timeout_s
        )
        run.fixed = _fixed(fixed, trace, "old_log_prob")
    return run


def tp_all_gather(timeout_s: float = 3.0, fix: bool = True, rows: int = 3) -> HangRun:
    """(d): ≤ v0.5 DP_COMPUTE_PROTO chunks ``rows`` generation rows over 2 ranks without the equal-size check (2 and
    1 rows), then all-gathers them inside the TP=2 group: rank 0 waits for a row rank 1 never sends."""
    first = -(-rows // WORLD)  # torch.chunk of `rows` over 2 ranks, no equal-size check: 2 and 1
    per_rank = [first, rows - first]
    results, left, elapsed = run_ranks("tp_gather_stage", per_rank, tp=2, timeout_s=timeout_s)
    diag = diagnose(
        "d",
        "the ≤ v0.5 TP all-gather with unequal rows",
        results,
        "pad the batch to a multiple of the world size before dispatch (pad_dataproto_to_divisor), or use "
        "the v0.6+ mesh dispatch that sends every TP rank the same chunk",
        f"rows per rank {per_rank} in TP group [0, 1]",
    )
    run = HangRun(diag, results, timeline(results), elapsed, timeout_s, left)
    if fix:
        padded = -(-rows // WORLD) * WORLD
        cfg = _config(
            f"data.train_batch_size={padded}", f"{ARR}.rollout.n=1", f"{ARR}.rollout.tensor_model_parallel_size=2"
        )
        trace = plan(cfg, dispatch="all_gather")
        fixed, _, _ = run_ranks("tp_gather_stage", [padded // WORLD] * WORLD, tp=2, timeout_s=timeout_s)
        run.fixed = _fixed(fixed, trace, "generate")
    return run


SCENARIOS = {"a": unsynced_dynamic_bsz, "b": light_rank_assert, "c": split_zero, "d": tp_all_gather}
