"""Golden corpus of ``labkit plan --json`` and ``labkit check`` outputs over random configs.

Used to prove that a refactor changes no behaviour: ``--write FILE`` records the outputs (one JSON line per case),
``--check FILE`` re-runs every case and lists the ones whose stdout, stderr or exit code differ. The configs are drawn
from a fixed seed, so the same script always builds the same cases.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys

from labkit.cli import main

A, R, C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "critic"


def random_overrides(rng: random.Random) -> list[str]:
    """One random verl override set: batch sizes, parallelism, micro-batching, critic and ref, deprecated keys."""
    pick = rng.choice
    gpn, nnodes = pick([1, 2, 4, 6, 8]), pick([1, 1, 1, 2])
    out = [
        f"trainer.n_gpus_per_node={gpn}",
        f"trainer.nnodes={nnodes}",
        f"data.train_batch_size={pick([4, 8, 16, 30, 32, 60, 64, 96, 128])}",
        f"{R}.n={pick([1, 2, 4, 5, 8, 12])}",
        f"{A}.ppo_mini_batch_size={pick([2, 4, 8, 16, 25, 32, 60, 64])}",
        f"{R}.tensor_model_parallel_size={pick([1, 1, 2, 4])}",
        f"{A}.ulysses_sequence_parallel_size={pick([1, 1, 2, 4])}",
        f"{R}.prompt_length={pick([64, 256, 512])}",
        f"{R}.response_length={pick([128, 512, 1024])}",
        f"algorithm.adv_estimator={pick(['grpo', 'grpo', 'gae'])}",
    ]
    if rng.random() < 0.5:
        out += [
            f"{A}.use_dynamic_bsz=true",
            f"{A}.ppo_max_token_len_per_gpu={pick([512, 2048, 4096, 16384])}",
            f"{R}.log_prob_use_dynamic_bsz=true",
            f"{R}.log_prob_max_token_len_per_gpu={pick([1024, 8192])}",
        ]
    else:
        out += [
            f"{A}.ppo_micro_batch_size_per_gpu={pick([1, 2, 4, 8])}",
            f"{R}.log_prob_micro_batch_size_per_gpu={pick([1, 2, 4, 8])}",
        ]
    if rng.random() < 0.15:
        out.append(f"{A}.ppo_micro_batch_size={pick([2, 4, 8])}")
    if rng.random() < 0.4:
        out += [f"{A}.use_kl_loss=true", f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={pick([1, 2, 4])}"]
    if rng.random() < 0.2:
        out.append(f"data.gen_batch_size={pick([8, 16, 32, 64])}")
    if rng.random() < 0.2:
        out.append(f"trainer.balance_batch={pick(['true', 'false'])}")
    if out[-1].endswith("gae") or any(o.endswith("=gae") for o in out):
        out += [
            f"{C}.ppo_mini_batch_size={pick([4, 8, 16, 32])}",
            f"{C}.ppo_micro_batch_size_per_gpu={pick([1, 2, 4])}",
        ]
    if rng.random() < 0.2:
        out.append(f"{R}.agent.num_workers={pick([1, 2, 3, 8])}")
    return out


def cases(count: int, seed: int) -> list[list[str]]:
    """Every command line of the corpus: each config under both profiles, two length profiles, plan and check."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        overrides = random_overrides(rng)
        for profile in ("legacy", "engine"):
            out.append(["check", *overrides, "--profile", profile])
            for lengths in ("gsm8k-like", "long-reasoning"):
                out.append(["plan", *overrides, "--profile", profile, "--json", "--lengths", lengths])
    return out


def run(argv: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except Exception as exc:  # recorded too: a refactor must not change a crash either
            code = f"{type(exc).__name__}: {exc}"
    return {"argv": argv, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _without_doc_links(case: dict) -> dict:
    """The case with ``labkit check``'s ``docs: docs/errors.md#…`` lines dropped (links added after the corpus)."""
    lines = case["stdout"].splitlines(keepends=True)
    return {**case, "stdout": "".join(x for x in lines if not x.lstrip().startswith("docs:  docs/errors.md#"))}


def main_(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE")
    mode.add_argument("--check", metavar="FILE")
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    ns = p.parse_args(argv)
    todo = cases(ns.count, ns.seed)
    if ns.write:
        with open(ns.write, "w") as fh:
            for argv_ in todo:
                fh.write(json.dumps(run(argv_)) + "\n")
        print(f"wrote {len(todo)} cases to {ns.write}")
        return 0
    with open(ns.check) as fh:
        golden = [json.loads(line) for line in fh]
    if [g["argv"] for g in golden] != todo:
        print("the corpus was written with other cases (count or seed)")
        return 1
    diffs = [g["argv"] for g in golden if _without_doc_links(run(g["argv"])) != _without_doc_links(g)]
    for argv_ in diffs[:20]:
        print("differs:", " ".join(argv_))
    print(f"{len(todo) - len(diffs)} of {len(todo)} cases identical")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main_())
