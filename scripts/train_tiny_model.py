"""Train the project's tiny Qwen2 causal LM on the tiny task (SFT on answer tokens), deterministically on CPU.

    .venv/bin/python scripts/train_tiny_model.py                      # full run -> data/tiny-qwen2
    .venv/bin/python scripts/train_tiny_model.py --steps 5 --out /tmp/x   # the first 5 steps of the same run

Every batch is drawn from its own seeded RNG (seed, step), the learning-rate schedule depends only on --total-steps,
and the thread count is fixed, so ``--steps K`` reproduces the first K losses of the full run exactly
(tests/test_tiny_model.py checks them against train_report.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labkit.model.tiny_model import (  # noqa: E402
    MAX_RESPONSE_TOKENS,
    TINY_MODEL_DIR,
    build_config,
    build_tokenizer,
    count_params,
    encode_example,
    generate_answers,
)
from labkit.model.tiny_task import make_examples, sample_example  # noqa: E402
from labkit.rl.reward import compute_score  # noqa: E402

EVAL_SEED = 1_000_003  # held-out prompts: a seed the training batches never use
MAX_EVAL_LOSS = 0.85  # stated bound on the shipped model's held-out response loss (tests/test_tiny_model.py checks it)
DEFAULTS = dict(seed=0, total_steps=800, batch_size=32, lr=3e-3, warmup=50, weight_decay=0.01, threads=1)


def batch_examples(seed: int, step: int, batch_size: int) -> list:
    """The training batch of one step; depends only on (seed, step)."""
    rng = random.Random(seed * 10_000_019 + step)
    return [sample_example(rng) for _ in range(batch_size)]


def collate(tokenizer, examples: list) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response rows; labels are the response tokens (answer + EOS), -100 elsewhere."""
    rows = [encode_example(tokenizer, ex) for ex in examples]
    width = max(len(p) + len(r) for p, r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        input_ids[i, :n] = torch.tensor(p + r)
        labels[i, len(p) : n] = torch.tensor(r)
        mask[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def response_loss(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Token-mean cross-entropy over response tokens (next-token prediction)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    tgt = batch["labels"][:, 1:]
    n_tok = int((tgt != -100).sum())
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return loss / n_tok, n_tok


def lr_at(step: int, args) -> float:
    """Linear warmup, then cosine decay to 10% over --total-steps (independent of --steps)."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, args.total_steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def eval_loss(model, tokenizer, n: int = 512, seed: int = EVAL_SEED) -> float:
    """Token-mean response loss on a fixed held-out set (fp32, batches of 128)."""
    model.eval()
    exs = make_examples(n, seed)
    total, count = 0.0, 0
    for i in range(0, n, 128):
        loss, k = response_loss(model, collate(tokenizer, exs[i : i + 128]))
        total, count = total + float(loss) * k, count + k
    return total / count


@torch.no_grad()
def eval_generation(model, tokenizer, n: int = 512, seed: int = EVAL_SEED, sample_seed: int = 0) -> dict:
    """Greedy and T=1.0 sampled exact-match accuracy per op, response-length histograms, EOS rate."""
    model.eval()
    exs = make_examples(n, seed)
    prompts = [ex.prompt for ex in exs]
    out: dict = {"n_prompts": n}
    for name, kw in {
        "greedy": dict(do_sample=False),
        "sampled_t1": dict(do_sample=True, temperature=1.0, seed=sample_seed),
    }.items():
        gen = {"response_ids": [], "texts": [], "lengths": [], "ended_with_eos": []}
        for i in range(0, n, 128):
            g = generate_answers(model, tokenizer, prompts[i : i + 128], **kw)
            for k in gen:
                gen[k] += g[k]
        scores = [compute_score(p, t) for p, t in zip(prompts, gen["texts"])]
        per_op: dict[str, list[float]] = {}
        for ex, s in zip(exs, scores):
            per_op.setdefault(ex.op, []).append(s)
        out[name] = {
            "accuracy": sum(scores) / n,
            "accuracy_per_op": {op: sum(v) / len(v) for op, v in sorted(per_op.items())},
            "eos_rate": sum(gen["ended_with_eos"]) / n,
            "response_length_hist": dict(sorted(Counter(gen["lengths"]).items())),
        }
    out["reference_length_hist"] = dict(sorted(Counter(len(ex.answer) + 1 for ex in exs).items()))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    ap.add_argument("--total-steps", type=int, default=DEFAULTS["total_steps"], help="length of the LR schedule")
    ap.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: --total-steps)")
    ap.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    ap.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    ap.add_argument("--warmup", type=int, default=DEFAULTS["warmup"])
    ap.add_argument("--weight-decay", type=float, default=DEFAULTS["weight_decay"])
    ap.add_argument("--threads", type=int, default=DEFAULTS["threads"])
    ap.add_argument("--out", type=Path, default=TINY_MODEL_DIR)
    ap.add_argument("--eval-every", type=int, default=0, help="print greedy accuracy every N steps (0: off)")
    ap.add_argument("--no-eval", action="store_true", help="skip the final generation eval (fast --steps runs)")
    args = ap.parse_args(argv)
    steps = args.total_steps if args.steps is None else args.steps
    if not 0 < steps <= args.total_steps:
        ap.error(f"--steps ({steps}) must be in 1..--total-steps ({args.total_steps})")

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    from transformers import GenerationConfig, Qwen2ForCausalLM

    tokenizer = build_tokenizer(seed=args.seed)
    config = build_config(tokenizer)
    model = Qwen2ForCausalLM(config)  # init drawn from torch.manual_seed(seed)
    model.config.use_cache = False
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        loss, _ = response_loss(model, collate(tokenizer, batch_examples(args.seed, step, args.batch_size)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % 50 == 0 or step == steps - 1:
            print(
                f"step {step:5d}  loss {losses[-1]:.4f}  lr {lr_at(step, args):.2e}  {time.perf_counter() - t0:6.1f}s",
                flush=True,
            )
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < steps:
            ev = eval_generation(model, tokenizer, n=256)
            print(
                f"  eval@{step + 1}: greedy {ev['greedy']['accuracy']:.3f} {ev['greedy']['accuracy_per_op']}"
                f"  t1 {ev['sampled_t1']['accuracy']:.3f}",
                flush=True,
            )
    train_s = time.perf_counter() - t0

    model.eval()
    model.config.use_cache = True
    report = {
        "seed": args.seed,
        "steps": steps,
        "total_steps": args.total_steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "warmup": args.warmup,
        "weight_decay": args.weight_decay,
        "threads": args.threads,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "n_params": count_params(model),
        "train_seconds": round(train_s, 1),
        "final_loss": losses[-1],
        "final_loss_mean_last_20": sum(losses[-20:]) / len(losses[-20:]),
        "eval_seed": EVAL_SEED,
        "eval_loss": eval_loss(model, tokenizer),
        "max_eval_loss": MAX_EVAL_LOSS,
        "losses": losses,
    }
    if not args.no_eval:
        report["eval"] = eval_generation(model, tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_new_tokens=MAX_RESPONSE_TOKENS,
        do_sample=False,
    )
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    (args.out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    summary = {k: v for k, v in report.items() if k not in ("losses", "eval")}
    print(json.dumps(summary, indent=1))
    if "eval" in report:
        print(json.dumps({k: report["eval"][k] for k in ("greedy", "sampled_t1")}, indent=1))
    return report


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
