"""Rollout engines side by side: vLLM (external_launcher, one engine per TP group) vs HF generate on TP shards, for
rollout TP 1 and 2, in one run and on the same workload: cold start of the group (processes up, then init_model:
mesh, weights, engine) and generation throughput (every row generates --tokens new tokens: EOS ignored), then the
vLLM/HF ratios.

Usage: python benchmarks/bench_rollout.py [--world 2] [--prompts 8] [--n 4] [--tokens 32] [--tp 1 2]
       [--engines vllm hf] [--launcher local|ray] [--repeats 3] [--json FILE]
Every rollout figure is the median of --repeats runs after a warm-up. The load average is printed with every row:
on a shared machine the numbers scale with it."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from labkit.trainer import live_config, live_rollout  # noqa: E402


def load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def bench(engine: str, world: int, tp: int, prompts: int, n: int, tokens: int, launcher: str, repeats: int) -> dict:
    """One group: its cold start, then the median of ``repeats`` rollouts of prompts·n rows × tokens (after a warm-up)."""
    cfg = live_config.rollout_config(
        [
            f"trainer.n_gpus_per_node={world}",
            f"data.train_batch_size={prompts}",
            f"actor_rollout_ref.rollout.n={n}",
            f"data.max_response_length={tokens}",
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
            f"actor_rollout_ref.rollout.name={engine}",
        ]
    )
    row: dict = {"engine": engine, "world": world, "tp": tp, "rows": prompts * n, "tokens": tokens, "load": load()}
    t0 = time.perf_counter()
    live = live_rollout.LiveRollout(cfg, launcher=launcher)
    row.update(cold_start_s=time.perf_counter() - t0, ran=live.engine, **live.timings)
    try:
        batch = live.batch(seed=0)
        live.run(batch, seed=0, ignore_eos=True)  # warm-up (first-request costs)
        times, new = [], 0
        for r in range(repeats):
            t = time.perf_counter()
            out, _ = live.run(batch, seed=r + 1, ignore_eos=True)
            times.append(time.perf_counter() - t)
            new = int(out.batch["response_length"].sum())
        row.update(rollout_s=statistics.median(times), new_tokens=new)
        row["tokens_per_s"] = new / row["rollout_s"]
    finally:
        row["left_pids"] = live.close()["left_pids"]
    row["load_after"] = load()
    return row


def ratios(rows: list[dict]) -> list[dict]:
    """vLLM / HF per TP: cold start and tokens/s (>1: vLLM slower to start / faster to generate)."""
    by = {(r["ran"], r["tp"]): r for r in rows}
    out = []
    for tp in sorted({r["tp"] for r in rows}):
        v, h = by.get(("vllm", tp)), by.get(("hf", tp))
        if v and h:
            out.append(
                {
                    "tp": tp,
                    "cold_start_vllm_over_hf": v["cold_start_s"] / h["cold_start_s"],
                    "tokens_per_s_vllm_over_hf": v["tokens_per_s"] / h["tokens_per_s"],
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--engines", nargs="+", default=["vllm", "hf"], choices=["vllm", "hf"])
    parser.add_argument("--launcher", default="local", choices=["ray", "local"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    t0 = time.perf_counter()
    rows = []
    for tp in args.tp:
        for engine in args.engines:
            r = bench(engine, args.world, tp, args.prompts, args.n, args.tokens, args.launcher, args.repeats)
            rows.append(r)
            print(
                f"{r['ran']:>4} W={r['world']} TP={tp}: cold start {r['cold_start_s']:.1f} s (group up "
                f"{r['group_up_s']:.1f} s + init_model {r['init_model_s']:.1f} s); {r['rows']} rows × {r['tokens']} "
                f"tokens in {r['rollout_s']:.3f} s = {r['tokens_per_s']:,.0f} tok/s; left {r['left_pids']}; "
                f"load {r['load']:.1f}->{r['load_after']:.1f}",
                flush=True,
            )
    for q in ratios(rows):
        print(
            f"TP={q['tp']}: vLLM/HF cold start {q['cold_start_vllm_over_hf']:.2f}x, tokens/s "
            f"{q['tokens_per_s_vllm_over_hf']:.2f}x",
            flush=True,
        )
    if args.json:
        result = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "launcher": args.launcher},
            "runs": rows,
            "ratios": ratios(rows),
            "wall_s": time.perf_counter() - t0,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
