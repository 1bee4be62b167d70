"""``labkit memory`` in-process and ``plan()`` at 16,384 sequences, this tree against a base revision, in one run.

The base (default: the commit before ``labkit.rules.run`` existed, the last tree that re-read the config in every
layer) is exported with ``git archive`` into a temporary folder; each round times it and this tree in turn, in
child processes of this one (interleaved, so both see the same machine). Each child reports the best CPU time
(``time.process_time``) of ``--reps`` calls per case, after one warm call. Prints each case's times and the ratio
this tree / base; exits 1 when a ratio exceeds ``--limit``.

Run: .venv/bin/python benchmarks/bench_resolved_run.py [--base REV] [--rounds N] [--reps N] [--limit R]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from bench_megatron_plan import BASE as PLAN_16K  # 2,048 prompts × n 8 = 16,384 sequences on 1,024 GPUs

ROOT = Path(__file__).resolve().parent.parent
FITS = [
    "data.train_batch_size=64",
    "actor_rollout_ref.rollout.n=4",
    "trainer.n_gpus_per_node=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
]
OOMS = [  # 8k responses, 16 rows a log-prob micro-batch: old_log_prob OOMs, the fix search runs
    "data.train_batch_size=256",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "data.max_response_length=8192",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
]
CHILD = """
import contextlib, gc, io, json, sys, time
from labkit.cli import main
from labkit.config.verl_config import load_config
from labkit.plan.step import plan
cases, reps = json.loads(sys.argv[1]), int(sys.argv[2])
def best(call):
    call()
    out = float("inf")
    for _ in range(reps):
        gc.collect()
        start = time.process_time()
        call()
        out = min(out, time.process_time() - start)
    return out
def memory(args):
    with contextlib.redirect_stdout(io.StringIO()):
        main(["memory", *args, "--gpu", "H100-80GB"])
times = {}
for name, kind, args, lengths in cases:
    if kind == "memory":
        times[name] = best(lambda: memory(args))
    else:
        cfg = load_config(None, args)
        times[name] = best(lambda: plan(cfg, lengths))
print(json.dumps(times))
"""
CASES = [
    ("labkit memory, a step that fits", "memory", FITS, None),
    ("labkit memory, an OOM with its fix search", "memory", OOMS, None),
    ("plan(), 16,384 sequences, no lengths", "plan", PLAN_16K, None),
    ("plan(), 16,384 sequences, gsm8k-like lengths", "plan", PLAN_16K, "gsm8k-like"),
]


def default_base() -> str:
    """The parent of the commit that added labkit/rules/run.py (HEAD when it is not committed yet)."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "labkit/rules/run.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return f"{added[-1]}^" if added else "HEAD"


def export(rev: str, into: Path) -> None:
    """The tree of ``rev`` (labkit/ and data/) written under ``into``."""
    blob = subprocess.run(["git", "archive", rev, "labkit", "data"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")


def timed(tree: Path, reps: int) -> dict[str, float]:
    """Best CPU seconds per case, measured in a child process importing labkit from ``tree``."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(CASES), str(reps)],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(f"timing in {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=None, help="the revision to compare with (default: before labkit.rules.run)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--limit", type=float, default=1.10, help="largest ratio this tree / base that passes")
    args = ap.parse_args()
    base_rev = args.base or default_base()
    with tempfile.TemporaryDirectory(prefix="labkit-base-") as tmp:
        export(base_rev, Path(tmp))
        best: dict[str, dict[str, float]] = {"base": {}, "this": {}}
        for _ in range(args.rounds):  # interleaved rounds; the best of all of them per side
            for side, tree in (("base", Path(tmp)), ("this", ROOT)):
                for name, t in timed(tree, args.reps).items():
                    best[side][name] = min(best[side].get(name, float("inf")), t)
    print(f"base: {base_rev}; best CPU time of {args.rounds}×{args.reps} calls per case")
    print(f"{'case':<48} {'base':>10} {'this tree':>10} {'ratio':>7}")
    worst = 0.0
    for name, *_ in CASES:
        b, t = best["base"][name], best["this"][name]
        worst = max(worst, t / b)
        print(f"{name:<48} {b * 1e3:>8.1f}ms {t * 1e3:>8.1f}ms {t / b:>7.2f}")
    return 0 if worst <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
