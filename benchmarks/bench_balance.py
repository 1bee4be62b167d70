"""labkit.balance.balance_batch vs verl 0.9.1 seqlen_balancing: speed and identical partitions, plus the planner's DP micro-batching.

Run: .venv/bin/python benchmarks/bench_balance.py [--reps N]. Exits 1 if any partition differs from verl's.
Times are the best of N interleaved runs in CPU time of this process (time.process_time: everything here is
single-threaded, and CPU time does not count other jobs on a shared machine). Primary columns: garbage collection off
while timing (as timeit does); the last column repeats the ratio with the collector on, as in a real training
process, where verl's many small objects also cost collection time.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from labkit.balance import balance_batch as balance
from labkit.balance.micro_batches import PROFILES, plan_dp_micro_batches

CASES = [  # (items, k_partitions, equal_size): _balance_batch-like (equal) and micro-batch-like (free) shapes
    (720, 6, True),
    (16384, 64, True),
    (2048, 16, False),
    (512, 40, False),
]


def best_of(fns: dict[str, Callable[[], Any]], reps: int, gc_off: bool) -> tuple[dict[str, float], dict[str, Any]]:
    """Best CPU time of each function over `reps` interleaved rounds, with its last result."""
    best = {name: float("inf") for name in fns}
    out: dict[str, Any] = {}
    for _ in range(reps):
        for name, fn in fns.items():
            gc.collect()
            if gc_off:
                gc.disable()
            try:
                start = time.process_time()
                out[name] = fn()
                best[name] = min(best[name], time.process_time() - start)
            finally:
                gc.enable()
    return best, out


def response_lengths(rng: random.Random, n: int) -> list[int]:
    """Prompt + response lengths with a long tail and some exact repeats (ties matter for KK)."""
    return [
        rng.choice([512 + rng.randint(1, 4096), 512 + int(rng.paretovariate(1.5) * 200) % 8192, 1024]) for _ in range(n)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5, help="rounds for the large case (4x for the small ones)")
    args = parser.parse_args()
    try:
        from verl.utils import seqlen_balancing as verl_sb
    except ImportError:
        print("verl 0.9.1 is not installed (pip install --no-deps verl==0.9.1): nothing to compare against")
        return 2
    gc.freeze()  # the ~0.5M objects of the torch/verl imports: out of every collection, so gc.collect() is cheap
    rng = random.Random(2026)
    all_identical = True
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'case':<24}{'labkit ms':>11}{'verl ms':>11}{'ratio':>8}{'ratio (gc on)':>15}  identical")
    for n, k, equal in CASES:
        workloads = balance.calculate_workload(response_lengths(rng, n))
        fns = {
            "labkit": lambda: balance.get_seqlen_balanced_partitions(workloads, k, equal),
            "verl": lambda: verl_sb.get_seqlen_balanced_partitions(workloads, k, equal),
        }
        reps = args.reps if n > 4096 else 4 * args.reps  # small cases are quick: more rounds, steadier minimum
        t, out = best_of(fns, reps, gc_off=True)
        t_on, _ = best_of(fns, reps, gc_off=False)
        same = out["labkit"] == out["verl"]
        same &= balance.karmarkar_karp(workloads, k, equal) == verl_sb.karmarkar_karp(workloads, k, equal)
        all_identical &= same
        name = f"N={n} k={k} {'equal' if equal else 'free'}"
        print(
            f"{name:<24}{t['labkit'] * 1e3:>11.2f}{t['verl'] * 1e3:>11.2f}{t['verl'] / t['labkit']:>7.1f}x"
            f"{t_on['verl'] / t_on['labkit']:>14.1f}x  identical: {same}"
        )

    per_rank = [response_lengths(rng, 256) for _ in range(64)]
    for profile in PROFILES:
        t, out = best_of({"plan": lambda: plan_dp_micro_batches(per_rank, 16384, profile=profile)}, args.reps, True)
        t_plan, plans = t["plan"], out["plan"]
        counts = {p.num_micro_batches for p in plans}
        print(
            f"planner: dynamic micro-batching, 64 ranks x 256 seqs ({profile}): {t_plan * 1e3:.1f} ms, "
            f"micro-batches per rank {sorted(counts)}"
        )
    plan_figures(args.reps)
    print("all identical:", all_identical)
    return 0 if all_identical else 1


PLAN_16K = [
    "data.train_batch_size=1024",
    "actor_rollout_ref.rollout.n=16",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "data.max_prompt_length=1024",
    "data.max_response_length=2048",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
]


def plan_figures(reps: int) -> None:
    """The whole planner (every stage, every rank) for 16,384 gsm8k-like lengths on 64 ranks, dynamic micro-batching,
    collector on as in a notebook: a cold plan, and a recomputation after the token budget changed (what a widget
    does: the _balance_batch result of the same lengths is reused). Goal < 100 ms. The median of many runs and the
    best are both printed: on a shared VM the same work varies up to 2x between runs."""
    from labkit.config.verl_config import load_config
    from labkit.plan import rollout_stages
    from labkit.plan.step import plan
    from labkit.rules.geometry import lengths_for_config

    budgets = [16384, 12288, 20480, 8192]
    for profile in PROFILES:
        cfgs = [
            load_config(
                overrides=PLAN_16K + [f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={b}"], profile=profile
            )
            for b in budgets
        ]
        lengths = lengths_for_config(cfgs[0], "gsm8k-like")
        for label, cold in (("cold", True), ("budget changed", False)):
            times = []
            for i in range(max(3 * reps, len(cfgs))):
                if cold:
                    rollout_stages._balanced.cache_clear()
                start = time.process_time()
                tr = plan(cfgs[i % len(cfgs)], lengths)
                times.append(time.process_time() - start)
            times.sort()
            print(
                f"planner: plan() 16,384 seqs, 64 ranks, dynamic ({profile}), {label}: median "
                f"{times[len(times) // 2] * 1e3:.1f} ms, best {times[0] * 1e3:.1f} ms CPU "
                f"({len(times)} runs, budgets {budgets}; {len(tr.ranks)} rank records)"
            )


if __name__ == "__main__":
    sys.exit(main())
