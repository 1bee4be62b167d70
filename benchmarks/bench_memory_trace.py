"""One run: how long ``labkit memory`` answers without a trace (in process, best of 3 after a warm-up) and with
``--trace`` for a 7B update of one 16k-token micro-batch (the CLI as a user runs it, wall clock), and the formula /
trace ratio of that pass. Targets: < 50 ms without --trace, < 10 s with it (2 cores).

    .venv/bin/python benchmarks/bench_memory_trace.py
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import time
from pathlib import Path

from labkit.cli import main

ARGS = [
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    "data.train_batch_size=256",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "data.max_prompt_length=1024",
    "data.max_response_length=3072",  # 4 rows x 4,096 = 16,384 tokens per update micro-batch
    "algorithm.adv_estimator=grpo",
]


MOE_ARGS = [a.replace("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-30B-A3B") for a in ARGS]


def bench_moe() -> dict[str, float]:
    """``--trace update_actor`` of Qwen3-30B-A3B (traced with TRACE_LAYERS of its 48 layers, the CLI as a user runs
    it) and, for scale, the same micro-batch traced with all 48 layers in one child (wall clock both)."""
    from labkit.model.trace_runner import run_trace

    labkit = Path(sys.executable).with_name("labkit")
    t0 = time.perf_counter()
    out = subprocess.run(
        [str(labkit), "memory", *MOE_ARGS, "--trace", "update_actor"], capture_output=True, text=True, timeout=300
    ).stdout
    cut = time.perf_counter() - t0
    ratio = float(re.search(r"formula / trace = ([0-9.]+)", out).group(1))
    t0 = time.perf_counter()
    run_trace("Qwen3-30B-A3B", [4096] * 4, update=True, timeout=600)
    return {"moe_trace_s": cut, "moe_ratio": ratio, "moe_full_s": time.perf_counter() - t0}


def bench() -> dict[str, float]:
    """Seconds without and with --trace, and the printed formula / trace ratio."""
    with contextlib.redirect_stdout(io.StringIO()):
        main(["memory", *ARGS])  # warm imports
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            main(["memory", *ARGS])
        best = min(best, time.perf_counter() - t0)
    labkit = Path(sys.executable).with_name("labkit")
    t0 = time.perf_counter()
    out = subprocess.run(
        [str(labkit), "memory", *ARGS, "--trace", "update_actor"], capture_output=True, text=True, timeout=300
    ).stdout
    traced = time.perf_counter() - t0
    ratio = float(re.search(r"formula / trace = ([0-9.]+)", out).group(1))
    tokens = int(re.search(r"\(Qwen2.5-7B, ([0-9,]+) tokens", out).group(1).replace(",", ""))
    return {"memory_s": best, "trace_s": traced, "ratio": ratio, "tokens": tokens}


if __name__ == "__main__":
    r = bench()
    print(f"labkit memory (no trace): {1000 * r['memory_s']:.1f} ms (target < 50 ms)")
    print(f"labkit memory --trace update_actor, 7B, {r['tokens']:,} tokens: {r['trace_s']:.1f} s (target < 10 s)")
    print(f"formula / trace of that update: {r['ratio']:.2f}")
    m = bench_moe()
    print(f"labkit memory --trace update_actor, Qwen3-30B-A3B (4 of 48 layers): {m['moe_trace_s']:.1f} s (< 30 s)")
    print(f"formula / trace of that update: {m['moe_ratio']:.2f}; all 48 layers traced: {m['moe_full_s']:.1f} s")
