"""Does the reward rise? ``labkit.trainer.recipes.learning_config()`` (16 prompts × n=8, 8 AdamW steps of lr 3e-4 per GRPO
step, fixed prompts) run for S GRPO steps on 4 local CPU ranks, for several seeds, with two controls: the same config
at lr 0 (no learning: the noise of the curve) and the same config with fresh prompts at every step.

Per run it prints the reward curve (critic/score/mean per step) and the rise = mean of the last k steps − mean of the
first k, also after 6 and 8 steps (the first steps of a run do not depend on how many follow).

Usage: python benchmarks/bench_grpo_reward.py [--steps 10] [--seeds 0 1 2 3 4] [--null-seeds 0 1 2]
       [--fresh-seeds 0 1 2] [--k 2] [--json benchmarks/bench_grpo_reward.json] [--md benchmarks/bench_grpo_reward.md]
       python benchmarks/bench_grpo_reward.py --from-json benchmarks/bench_grpo_reward.json --md ... (report only)
One run at a time (one worker group of 4 rank processes). About 10 s to start a group and 4–6 s per step on 2
shared cores; the load average is recorded with every run."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from labkit.trainer.grpo_trainer import mean_scores  # noqa: E402
from labkit.trainer.recipes import LEARNING_LR, LEARNING_OVERRIDES, learning_trainer, reward_rise  # noqa: E402

HORIZONS = (6, 8)
SCREENING = (
    "How the config was chosen (ad hoc screening runs, seeds 0–2, 8 steps, rise of last 2 − first 2; not re-run by "
    "this script): the trainer's default shape (8 prompts × 4, one AdamW step per GRPO step) at lr 3e-5 and 1e-4 "
    "rose by −0.02…+0.08 (noise level); 16 × 8 with 4 updates per step (mini 4) at lr 1e-4 / 3e-4 / 1e-3 by "
    "+0.06…+0.11; 8 updates per step (mini 2) at lr 3e-4 by +0.10…+0.15 (seeds 0–1), at 5e-4 by +0.00…+0.09; "
    "mini 2 × 2 epochs at lr 2e-4 by +0.06…+0.08; mini 4 × 2 epochs at lr 1e-3 fell back on one seed of two "
    "(0.33 → 0.20–0.24); temperature 1.2 was no faster. Restricting the task to desc/sort/len(/max) (dropping ops "
    "the model almost never or always gets right) gave +0.05…+0.17, no clear gain, so the full task is kept."
)


def load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run(kind: str, seed: int, steps: int, k: int) -> dict:
    """One trainer: ``kind`` "learn" (the config as is), "null" (lr 0) or "fresh" (new prompts every step)."""
    kwargs = {"null": {"lr": 0.0}, "fresh": {"fixed_prompts": False}}.get(kind, {})
    row: dict = {"kind": kind, "seed": seed, "load_before": load()}
    t0 = time.perf_counter()
    with learning_trainer(seed, **kwargs) as tr:
        row["up_s"] = time.perf_counter() - t0
        history = tr.run(steps)
        row["left_pids"] = tr.close()["left_pids"]
    curve = mean_scores(history)
    row.update(
        curve=curve,
        step_s=[round(h["timing_s/step"], 2) for h in history],
        entropy=[round(h["actor/entropy"], 4) for h in history],
        response_length=[round(h["response_length/mean"], 2) for h in history],
        pg_clipfrac=[round(h["actor/pg_clipfrac"], 4) for h in history],
        first=sum(curve[:k]) / k,
        last=sum(curve[-k:]) / k,
        rise=reward_rise(curve, k),
        rise_at={h: reward_rise(curve[:h], k) for h in HORIZONS if h <= steps},
        load_after=load(),
    )
    return row


def summary(rows: list[dict], kind: str, steps: int) -> dict:
    """min / mean / max of the rise over the seeds of one kind, at every horizon."""
    out = {}
    for h in [*[h for h in HORIZONS if h < steps], steps]:
        vals = [r["rise"] if h == steps else r["rise_at"][h] for r in rows if r["kind"] == kind]
        if vals:
            out[h] = {
                "min": min(vals),
                "mean": statistics.mean(vals),
                "max": max(vals),
                "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            }
    return out


def step_sd(rows: list[dict], kind: str) -> float:
    """Pooled within-run sd of the per-step reward (for "null": pure sampling noise, the policy never changes)."""
    var = [statistics.variance(r["curve"]) for r in rows if r["kind"] == kind and len(r["curve"]) > 1]
    return (sum(var) / len(var)) ** 0.5 if var else float("nan")


def findings(res: dict) -> str:
    """The measured conclusion, in words, from the runs."""
    S, k, sm, runs = res["steps"], res["k"], res["summary"], res["runs"]
    h = 8 if 8 in sm.get("learn", {}) else S
    learn, null, fresh = sm.get("learn", {}).get(h), sm.get("null", {}).get(h), sm.get("fresh", {}).get(h)
    out = []
    if learn:
        n_up = sum(1 for r in runs if r["kind"] == "learn" and (r["rise"] if h == S else r["rise_at"][h]) > 0)
        out.append(
            f"**Findings.** With fixed prompts the reward rose in {n_up} of "
            f"{sum(r['kind'] == 'learn' for r in runs)} seeds: after {h} steps by {learn['min']:+.3f} … "
            f"{learn['max']:+.3f} (mean {learn['mean']:+.3f}), after {S} steps by "
            f"{sm['learn'][S]['min']:+.3f} … {sm['learn'][S]['max']:+.3f}."
        )
    if null:
        sd = step_sd(runs, "null")
        out.append(
            f"Without learning (lr 0) the same measure moved by {null['min']:+.3f} … {null['max']:+.3f} "
            f"after {h} steps; the per-step reward of those runs has sd {sd:.3f} (128 samples of a fixed "
            f"policy), so a rise of {k} vs {k} steps has noise sd ≈ {sd * (2 / k) ** 0.5:.3f}."
        )
    if fresh:
        out.append(
            f"With fresh prompts at every step the prompt draw dominates (per-step sd "
            f"{step_sd(runs, 'fresh'):.3f}); the rise after {h} steps ranged {fresh['min']:+.3f} … "
            f"{fresh['max']:+.3f}, so no rise is visible in {S} steps: the gain measured with fixed prompts "
            f"is on those 16 prompts, not shown here to carry over to new ones."
        )
    return " ".join(out)


def markdown(res: dict) -> str:
    S, k = res["steps"], res["k"]
    early = [h for h in HORIZONS if h < S]
    fmt = lambda c: " ".join(f"{x:.2f}" for x in c)  # noqa: E731
    lines = [
        "# GRPO reward over steps (`benchmarks/bench_grpo_reward.py`)",
        "",
        f"`python benchmarks/bench_grpo_reward.py --json benchmarks/bench_grpo_reward.json` on a "
        f"{res['machine']['cpus']}-core machine shared with another job (load average "
        f"{min(r['load_before'] for r in res['runs']):.1f}–{max(r['load_before'] for r in res['runs']):.1f}). "
        f"Config `labkit.trainer.recipes.learning_config()`: the trainer's 4-rank GRPO defaults + "
        f"`{' '.join(res['overrides'])}`, fixed prompts, shipped tiny Qwen2, local launcher. {S} GRPO steps per run; "
        f"reward = `critic/score/mean` (fraction of exact answers over 16 prompts × 8 samples); "
        f"rise = mean of the last {k} steps − mean of the first {k}.",
        "",
        "Controls: **null** = the same config and seeds at lr 0 (the policy never changes: the rise is sampling "
        "noise); **fresh** = new prompts at every step (the prompt draw adds its own noise).",
        "",
        "| "
        + " | ".join(
            [
                "run",
                "seed",
                f"reward per step (1…{S})",
                f"first {k}",
                f"last {k}",
                *[f"rise @{h}" for h in early],
                f"rise @{S}",
                "s/step (median)",
            ]
        )
        + " |",
        "|" + "---|" * (7 + len(early)),
    ]
    for r in res["runs"]:
        at = "".join(f"{r['rise_at'][h]:+.3f} | " for h in early)
        lines.append(
            f"| {r['kind']} | {r['seed']} | {fmt(r['curve'])} | {r['first']:.3f} | {r['last']:.3f} | "
            f"{at}**{r['rise']:+.3f}** | {statistics.median(r['step_s']):.1f} |"
        )
    lines += ["", "| run | steps | rise min | mean | max | sd over seeds |", "|---|---|---|---|---|---|"]
    for kind, by_h in res["summary"].items():
        for h, s in by_h.items():
            lines.append(f"| {kind} | {h} | {s['min']:+.3f} | {s['mean']:+.3f} | {s['max']:+.3f} | {s['sd']:.3f} |")
    lines += [
        "",
        findings(res),
        "",
        SCREENING,
        "",
        f"Wall time {res['wall_s'] / 60:.1f} min; processes left after every run: "
        f"{sorted({p for r in res['runs'] for p in r['left_pids']}) or 'none'}.",
        "",
    ]
    return "\n".join(lines)


def from_json(res: dict) -> dict:
    """A --json file as main() built it (JSON turned the integer step keys into strings)."""
    res["summary"] = {kind: {int(h): v for h, v in by_h.items()} for kind, by_h in res["summary"].items()}
    for r in res["runs"]:
        r["rise_at"] = {int(h): v for h, v in r["rise_at"].items()}
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    parser.add_argument("--null-seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--fresh-seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--k", type=int, default=2, help="steps averaged at each end of the curve")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--md", default=None, help="also write the markdown report to this file")
    parser.add_argument("--from-json", default=None, help="run nothing: rewrite --md from this earlier --json")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            res = from_json(json.load(f))
        with open(args.md, "w") as f:
            f.write(markdown(res))
        return
    t0 = time.perf_counter()
    res: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "launcher": "local"},
        "overrides": list(LEARNING_OVERRIDES),
        "lr": LEARNING_LR,
        "steps": args.steps,
        "k": args.k,
        "runs": [],
    }
    for kind, seeds in (("learn", args.seeds), ("null", args.null_seeds), ("fresh", args.fresh_seeds)):
        for seed in seeds:
            row = run(kind, seed, args.steps, args.k)
            res["runs"].append(row)
            print(
                f"{kind:5s} seed {seed}: reward {' '.join(f'{x:.3f}' for x in row['curve'])}; first {args.k} "
                f"{row['first']:.3f}, last {args.k} {row['last']:.3f}, rise {row['rise']:+.3f} "
                f"({', '.join(f'@{h} {v:+.3f}' for h, v in row['rise_at'].items())}); up {row['up_s']:.1f} s, "
                f"step median {statistics.median(row['step_s']):.1f} s; load {row['load_before']:.1f}->"
                f"{row['load_after']:.1f}; left {row['left_pids']}",
                flush=True,
            )
    res["summary"] = {kind: summary(res["runs"], kind, args.steps) for kind in ("learn", "null", "fresh")}
    res["wall_s"] = time.perf_counter() - t0
    for kind, by_h in res["summary"].items():
        for h, s in by_h.items():
            print(
                f"{kind:5s} rise after {h} steps over seeds: min {s['min']:+.3f} mean {s['mean']:+.3f} "
                f"max {s['max']:+.3f} sd {s['sd']:.3f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(res))


if __name__ == "__main__":
    main()
