"""Live rollout timings: a worker group of RolloutWorkers up (Ray + actors + gloo, then init_model: mesh, model, TP
shards), and a rollout of 8 prompts x n=4 x 64 new tokens on 4 ranks (every row generates 64 tokens: EOS ignored),
for rollout TP 1 and 2 and both dispatches; plus the same rollout stopping at EOS.

Usage: python benchmarks/bench_rollout.py [--world 4] [--prompts 8] [--n 4] [--tokens 64] [--tp 1 2]
       [--launcher ray|local] [--repeats 3] [--json benchmarks/bench_rollout.json]
Goals on the 2-core CI machine: group of 4 up < 10 s; the rollout < 10 s after start-up. The load average is
printed with every figure: on a shared machine the numbers scale with it."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from labkit.trainer import live_rollout  # noqa: E402


def load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (load-independent-ish: what the work itself costs)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(world: int, tp: int, prompts: int, n: int, tokens: int, launcher: str, repeats: int) -> dict:
    """One group: bring-up figures, then per dispatch the median of `repeats` rollouts (a warm-up run first)."""
    cfg = live_rollout.rollout_config(
        [
            f"trainer.n_gpus_per_node={world}",
            f"data.train_batch_size={prompts}",
            f"actor_rollout_ref.rollout.n={n}",
            f"data.max_response_length={tokens}",
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
        ]
    )
    row: dict = {"world": world, "tp": tp, "rows": prompts * n, "max_new_tokens": tokens, "load_before": load()}
    t0 = time.perf_counter()
    owned = live_rollout.hold_ray(max(4, world)) if launcher == "ray" else False
    row["ray_init_s"] = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        live = live_rollout.LiveRollout(cfg, launcher=launcher)
        row.update(live.timings, up_total_s=time.perf_counter() - t0, weights=live.info[0]["weights"])
        row["rank_cpu_up_s"] = [round(cpu_s(p), 2) for p in live.wg.pids]
        try:
            batch = live.batch(seed=0)
            for dispatch, ignore_eos in (("mesh", True), ("all_gather", True), ("mesh", False)):
                name = f"{dispatch}{'' if ignore_eos else '_eos'}"
                live.run(batch, dispatch=dispatch, seed=0, ignore_eos=ignore_eos)  # warm-up
                times, new, cpu0 = [], 0, [cpu_s(p) for p in live.wg.pids]
                for r in range(repeats):
                    t = time.perf_counter()
                    out, _ = live.run(batch, dispatch=dispatch, seed=r + 1, ignore_eos=ignore_eos)
                    times.append(time.perf_counter() - t)
                    new = int(out.batch["response_length"].sum())
                row[f"rollout_{name}_s"] = statistics.median(times)
                row[f"new_tokens_{name}"] = new
                row[f"rank_cpu_{name}_s"] = [round((cpu_s(p) - c) / repeats, 2) for p, c in zip(live.wg.pids, cpu0)]
        finally:
            row["cleanup"] = {"left_pids": live.close()["left_pids"]}
            row.update(close_s=live.timings["close_s"])
    finally:
        live_rollout.release_ray(owned)
    row["load_after"] = load()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--launcher", default="ray", choices=["ray", "local"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    t_ray = time.perf_counter()
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "launcher": args.launcher},
        "runs": [],
    }
    for tp in args.tp:
        row = bench(args.world, tp, args.prompts, args.n, args.tokens, args.launcher, args.repeats)
        results["runs"].append(row)
        print(
            f"W={row['world']} TP={tp}: ray init {row['ray_init_s']:.1f} s, group up {row['group_up_s']:.1f} s + "
            f"init_model {row['init_model_s']:.1f} s = {row['up_total_s']:.1f} s; "
            f"rollout {row['rows']} rows x {row['max_new_tokens']} tokens: mesh "
            f"{row['rollout_mesh_s']:.2f} s ({row['new_tokens_mesh']} new tokens), all_gather "
            f"{row['rollout_all_gather_s']:.2f} s; stopping at EOS (mesh) {row['rollout_mesh_eos_s']:.2f} s "
            f"({row['new_tokens_mesh_eos']} new tokens); close {row['close_s']:.1f} s; "
            f"left {row['cleanup']['left_pids']}; rank CPU s: up {row['rank_cpu_up_s']}, rollout "
            f"{row['rank_cpu_mesh_s']}; load {row['load_before']:.1f}->{row['load_after']:.1f}",
            flush=True,
        )
    results["wall_s"] = time.perf_counter() - t_ray
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
