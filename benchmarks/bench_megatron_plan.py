"""``labkit.plan.step.plan`` on a 1,024-GPU Megatron layout (TP 8, PP 8 → D 16) against the FSDP plan of the same
step (D 1,024), measured in one run: 2,048 prompts × n 8 = 16,384 sequences, with and without lengths.

Run: .venv/bin/python benchmarks/bench_megatron_plan.py [--reps N]. Times are the best of N interleaved runs in CPU
time of this process (time.process_time: the planner is single-threaded, and CPU time does not count other jobs on a
shared machine). Prints each time and the ratio Megatron / FSDP; exits 1 when the Megatron plan takes over 200 ms.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

from labkit.config.verl_config import load_config
from labkit.plan.step import plan

BASE = [
    "data.train_batch_size=2048",
    "actor_rollout_ref.rollout.n=8",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=128",
    "actor_rollout_ref.actor.ppo_mini_batch_size=512",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
    "algorithm.adv_estimator=grpo",
]
MEGATRON = [
    "model_engine=megatron",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8",
]
LIMIT_S = 0.2


def best_time(cfg, lengths, reps: int) -> float:
    """Best CPU seconds of ``plan(cfg, lengths)`` over ``reps`` runs."""
    best = float("inf")
    for _ in range(reps):
        gc.collect()
        start = time.process_time()
        plan(cfg, lengths)
        best = min(best, time.process_time() - start)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    fsdp, megatron = load_config(None, BASE), load_config(None, BASE + MEGATRON)
    worst = 0.0
    print(f"{'lengths':<12} {'FSDP (D 1024)':>14} {'Megatron (D 16)':>16} {'ratio':>7}")
    for lengths in (None, "gsm8k-like"):
        times = {}
        for name, cfg in (("fsdp", fsdp), ("megatron", megatron)):  # interleaved: each pair shares the machine's state
            times[name] = best_time(cfg, lengths, args.reps)
        worst = max(worst, times["megatron"])
        print(
            f"{lengths or 'none':<12} {times['fsdp'] * 1e3:>11.1f} ms {times['megatron'] * 1e3:>13.1f} ms "
            f"{times['megatron'] / times['fsdp']:>7.2f}"
        )
    print(f"Megatron plan: {worst * 1e3:.1f} ms at worst (limit {LIMIT_S * 1e3:.0f} ms)")
    memory = memory_time(args.reps)
    print(
        f"labkit memory on a Megatron config (Qwen3-8B, TP 2 · PP 2, fixes searched): {memory * 1e3:.1f} ms "
        f"(limit {MEMORY_LIMIT_S * 1e3:.0f} ms)"
    )
    return 0 if worst <= LIMIT_S and memory <= MEMORY_LIMIT_S else 1


MEMORY_LIMIT_S = 0.05
MEMORY_ARGS = [
    "memory",
    "model_engine=megatron",
    "trainer.n_gpus_per_node=8",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.model.path=Qwen/Qwen3-8B",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "data.train_batch_size=64",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.rollout.n=4",
]


def memory_time(reps: int) -> float:
    """Best CPU seconds of ``labkit memory`` in process (its output discarded), after one warm-up run."""
    import contextlib
    import io

    from labkit.cli import main as labkit_main

    best = float("inf")
    for k in range(reps + 1):
        start = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            labkit_main(MEMORY_ARGS)
        if k:
            best = min(best, time.process_time() - start)
    return best


if __name__ == "__main__":
    sys.exit(main())
