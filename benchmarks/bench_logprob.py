"""Log-prob forward: padded static vs packed static vs packed dynamic, naive vs chunked log-prob.

Run: .venv/bin/python benchmarks/bench_logprob.py [--cpu-rows N] [--cpu-reps N] [--head-tokens N] [--skip-cpu]
[--skip-gpu]. CPU part: the shipped tiny Qwen2 (fp32, sdpa, one thread) through labkit.model.logprob.forward_micro_batch,
as verl's compute_log_prob runs it: padded path = full rollout width per row (not the micro-batch max), packed
path = real tokens only; then the log-prob head alone at Qwen2-0.5B's vocabulary, naive vs chunked, time and peak
memory (VmHWM) against the predicted bytes. GPU part (only with CUDA): the same head in bf16 at the token budget,
then a Qwen2-0.5B-shaped model (random init, bf16), sdpa on the padded path, flex_attention on packed rows padded
up to a multiple of --pad-multiple (flex recompiles per new length), one warm pass then one timed pass per variant,
peak memory per variant; stops early past --gpu-budget-s.
Imports only labkit modules free of ray/tensordict, so it runs on the GPU image (torch + transformers only).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from labkit.balance.micro_batches import rearrange_micro_batches, static_micro_batches  # noqa: E402
from labkit.config.lengths import draw  # noqa: E402
from labkit.model.logits import logprobs_from_logits, logprobs_from_logits_chunked  # noqa: E402
from labkit.model.logprob import forward_micro_batch  # noqa: E402
from labkit.model.logprob_memory import measure_logprob_head  # noqa: E402
from labkit.model.packing import pack_micro_batch  # noqa: E402
from labkit.model.ulysses import ulysses_pad  # noqa: E402
from labkit.model.ulysses_demo import demo_batch  # noqa: E402

QWEN2_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1e6,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)


def make_batch(
    lengths: list[int], prompt_width: int, response_width: int, vocab: int, seed: int = 0, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """verl-shaped rows (labkit.model.ulysses_demo.demo_batch) from total lengths, each split in the width's proportion
    (at least 1 prompt and 1 response token)."""
    width = prompt_width + response_width
    prompts, responses = [], []
    for total in lengths:
        p = int(np.clip(round(total * prompt_width / width), 1, prompt_width))
        r = int(np.clip(total - p, 1, response_width))
        prompts.append(int(np.clip(total - r, 1, prompt_width)))
        responses.append(r)
    batch = demo_batch(prompts, responses, prompt_width, response_width, vocab, seed)
    return {k: torch.from_numpy(v).to(device) for k, v in batch.items()}


def select(batch: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
    idx = torch.tensor(rows, dtype=torch.long, device=batch["input_ids"].device)
    return {k: v.index_select(0, idx) for k, v in batch.items()}


def plans(lengths: list[int], rows_per_micro: int, budget: int) -> dict[str, list[list[int]]]:
    """Static micro-batches of ``rows_per_micro`` rows, and verl's dynamic micro-batches under a token budget."""
    return {
        "static": static_micro_batches(len(lengths), rows_per_micro, profile="legacy"),
        "dynamic": rearrange_micro_batches(lengths, budget, profile="engine").indices,
    }


def report(name: str, seconds: float, real_tokens: int, fed_tokens: int, peak_gib: float | None = None) -> None:
    peak = f"  peak {peak_gib:6.2f} GiB" if peak_gib is not None else ""
    print(
        f"  {name:40s} {seconds:8.3f} s  {real_tokens / seconds:12,.0f} real tok/s  fed tokens {fed_tokens:>10,}{peak}",
        flush=True,
    )


def ratio_line(label: str, fast: float, slow: float, goal: float | None = None) -> None:
    verdict = "" if goal is None else ("  GOAL MET" if slow / fast >= goal else f"  GOAL MISSED (< {goal}x)")
    print(f"  ratio {label}: {slow / fast:.2f}x{verdict}", flush=True)


# ---- CPU: the tiny model through labkit.model.logprob.forward_micro_batch -----------------------------------------------
def cpu_part(rows: int, reps: int, seed: int) -> dict[str, float]:
    """Best-of-``reps`` CPU time of each variant on ``rows`` gsm8k-like rows scaled to the tiny model's 128 width."""
    from labkit.model.tiny_model import load_tiny_model

    torch.set_num_threads(1)
    model = load_tiny_model()
    prompt_w, response_w, rows_per_micro = 64, 64, 8
    width = prompt_w + response_w
    # gsm8k-like at 512 + 512, scaled by 1/8 to the 128-token window of the tiny model (median ~43 of 128)
    lengths = [max(2, -(-x // 8)) for x in draw("gsm8k-like", rows, 1, 512, 512, seed=seed)]
    batch = make_batch(lengths, prompt_w, response_w, model.config.vocab_size, seed)
    budget = rows_per_micro * width  # the padded static micro-batch's token count: same logits memory bound
    micro = plans(lengths, rows_per_micro, budget)
    real = int(sum(lengths))
    print(
        f"CPU part: tiny Qwen2 ({sum(p.numel() for p in model.parameters()):,} params, V={model.config.vocab_size}), "
        f"{rows} rows, width {width}, {real:,} real tokens, static {rows_per_micro} rows/micro "
        f"({len(micro['static'])} micro), dynamic budget {budget} ({len(micro['dynamic'])} micro)",
        flush=True,
    )
    variants: dict[str, tuple[str, bool, bool]] = {  # name: (plan, use_remove_padding, chunked)
        "A padded static, naive": ("static", False, False),
        "B packed static, naive": ("static", True, False),
        "C packed dynamic, naive": ("dynamic", True, False),
        "D packed dynamic, chunked": ("dynamic", True, True),
    }
    micro_batches = {p: [select(batch, r) for r in micro[p]] for p in micro}
    best, outputs = {}, {}
    with torch.no_grad():
        for _ in range(reps):
            for name, (plan, rmpad, chunked) in variants.items():
                t0 = time.process_time()
                out = [
                    forward_micro_batch(model, mb, use_remove_padding=rmpad, chunked=chunked, chunk_size=256)[0]
                    for mb in micro_batches[plan]
                ]
                best[name] = min(best.get(name, float("inf")), time.process_time() - t0)
                order = [i for r in micro[plan] for i in r]
                outputs[name] = torch.cat(out)[torch.argsort(torch.tensor(order))]
    resp_mask = batch["attention_mask"][:, prompt_w:].bool()
    for name in variants:
        fed = rows * width if not variants[name][1] else real
        report(name, best[name], real, fed)
    diff = max(float((outputs[n] - outputs["A padded static, naive"])[resp_mask].abs().max()) for n in variants)
    print(f"  max |log p - padded log p| over response tokens, all variants: {diff:.2e}", flush=True)
    ratio_line("B packed static / A padded", best["B packed static, naive"], best["A padded static, naive"])
    ratio_line("C packed dynamic / A padded", best["C packed dynamic, naive"], best["A padded static, naive"], 1.5)
    ratio_line("C packed dynamic / B packed static", best["C packed dynamic, naive"], best["B packed static, naive"])
    ratio_line("D chunked / C naive", best["D packed dynamic, chunked"], best["C packed dynamic, naive"])
    padded_mib = rows_per_micro * width * model.config.vocab_size * 4 / 2**20
    print(
        f"  logits: fed tokens x V x 4 B = {padded_mib:.2f} MiB per padded micro-batch, too small to measure "
        "here; the head section measures them at a real vocabulary",
        flush=True,
    )
    return {**best, "max_diff": diff}


# ---- the log-prob head alone at Qwen2-0.5B's vocabulary: naive vs chunked, time and peak memory --------------------
def head_part(tokens: int, chunk: int, reps: int, device: str, seed: int) -> None:
    """labkit.model.logprob_memory.measure_logprob_head at Qwen2-0.5B's hidden size and vocabulary, bf16 on CUDA and fp32
    on CPU: seconds and peak memory of naive vs chunked, against logprob_peak_bytes."""
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    H, V = QWEN2_05B["hidden_size"], QWEN2_05B["vocab_size"]
    print(
        f"log-prob head ({device}, {str(dtype).removeprefix('torch.')}): {tokens:,} tokens x H {H} x V {V:,}, "
        f"chunk {chunk}",
        flush=True,
    )
    runs = measure_logprob_head(tokens, H, V, chunk, device=device, dtype=dtype, reps=reps, seed=seed)
    for name, run in runs.items():
        seen = (
            "not measurable here"
            if run.peak_bytes is None
            else f"{run.peak_bytes / 2**20:9.1f} MiB ({run.peak_bytes / run.predicted_bytes:.3f} x predicted)"
        )
        print(
            f"  {name:8s} {run.seconds:7.3f} s  {tokens / run.seconds:12,.0f} tok/s  peak {seen}; predicted "
            f"{run.predicted_bytes / 2**20:9.1f} MiB",
            flush=True,
        )
    naive, chunked = runs["naive"], runs["chunked"]
    print(f"  max |chunked - naive| log p: {float((chunked.log_probs - naive.log_probs).abs().max()):.2e}", flush=True)
    ratio_line(f"chunked / naive head speed ({device})", chunked.seconds, naive.seconds, 1.5 if cuda else None)
    if naive.peak_bytes and chunked.peak_bytes is not None:
        mem = chunked.peak_bytes / naive.peak_bytes
        verdict = ("  GOAL MET" if mem <= 0.5 else "  GOAL MISSED (> 0.5)") if cuda else ""
        print(f"  peak memory chunked / naive head ({device}): {mem:.3f}{verdict}", flush=True)


# ---- GPU: Qwen2-0.5B shape, bf16, flex_attention on packed rows ----------------------------------------------------
TINY_DRY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def _gpu_variant(fn: Callable[[], int], real: int, name: str, cuda: bool) -> tuple[float, float]:
    """Warm pass (compiles), then a timed pass; (seconds, peak GiB of the timed pass; 0 off CUDA)."""
    fn()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    fed = fn()
    if cuda:
        torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    report(name, sec, real, fed, peak if cuda else None)
    return sec, peak


def gpu_part(
    seqs: int, budget: int, pad_multiple: int, chunk_size: int, budget_s: float, seed: int, dry_run_cpu: bool = False
) -> None:
    """Padded (sdpa) vs packed static / dynamic (flex_attention); naive vs chunked log-prob on packed dynamic.
    ``dry_run_cpu`` (no CUDA only): the same code on CPU with a tiny config, fp32, sdpa and narrow rows (a smoke test)."""
    if not torch.cuda.is_available():
        print("GPU part skipped: no CUDA device", flush=True)
        if not dry_run_cpu:
            return
    from transformers import Qwen2Config, Qwen2ForCausalLM

    start = time.perf_counter()
    cuda = torch.cuda.is_available()
    if cuda:  # seconds, before the model: figures even if a flex_attention pass outlasts the budget
        head_part(budget, chunk_size, 3, "cuda", seed)
    device, cfg = ("cuda", QWEN2_05B) if cuda else ("cpu", TINY_DRY)
    packed_attn = "flex_attention" if cuda else "sdpa"
    prompt_w, response_w, rows_per_micro = (512, 3584, 8) if cuda else (64, 64, 4)
    dyn = torch._dynamo.config
    setattr(dyn, "recompile_limit" if hasattr(dyn, "recompile_limit") else "cache_size_limit", 64)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**cfg, attn_implementation="sdpa"))
    model = model.to(torch.bfloat16 if cuda else torch.float32).eval()
    if cuda:  # the anchor's batch: long-reasoning at 512 + 3584
        lengths = draw("long-reasoning", seqs, 1, prompt_w, response_w, seed=seed)
    else:  # gsm8k-like scaled by 1/8, as in the CPU part
        lengths = [max(2, -(-x // 8)) for x in draw("gsm8k-like", seqs, 1, 512, 512, seed=seed)]
    batch = make_batch(lengths, prompt_w, response_w, cfg["vocab_size"], seed, device=device)
    micro = plans(lengths, rows_per_micro, budget)
    real, V = int(sum(lengths)), cfg["vocab_size"]
    weights_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    name = torch.cuda.get_device_name() if cuda else "CPU dry run (tiny config)"
    print(
        f"GPU part: {name}, Qwen2 {'0.5B' if cuda else 'tiny'} shape ({weights_gib:.2f} GiB bf16 weights), {seqs} "
        f"seqs, {real:,} real tokens ({seqs * (prompt_w + response_w):,} padded), static {rows_per_micro} rows "
        f"({len(micro['static'])} micro), dynamic budget {budget} ({len(micro['dynamic'])} micro), packed rows padded "
        f"to x{pad_multiple}",
        flush=True,
    )
    mbs = {p: [select(batch, r) for r in micro[p]] for p in micro}

    def padded_naive() -> int:
        model.set_attn_implementation("sdpa")
        fed = 0
        for mb in mbs["static"]:
            logits = model(
                input_ids=mb["input_ids"],
                attention_mask=mb["attention_mask"],
                position_ids=mb["position_ids"],
                use_cache=False,
            ).logits
            logprobs_from_logits(logits.float(), torch.roll(mb["input_ids"], -1, 1))  # fp32 log-softmax, all tokens
            fed += mb["input_ids"].numel()
            del logits
        return fed

    def packed(plan: str, mode: str) -> Callable[[], int]:
        def run() -> int:
            model.set_attn_implementation(packed_attn)
            fed = 0
            for mb in mbs[plan]:
                p = pack_micro_batch(mb["input_ids"], mb["attention_mask"], mb["position_ids"])
                ids, pos, _ = ulysses_pad(p.input_ids, p.position_ids, pad_multiple)  # pad = its own segment
                labels = F.pad(p.labels, (0, ids.size(1) - p.labels.size(1)))
                if mode == "chunked":  # hidden states + LM-head weight: no (T, V) tensor at all
                    hidden = model.model(
                        input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False
                    ).last_hidden_state
                    logprobs_from_logits_chunked(hidden[0], labels[0], chunk_size, lm_head_weight=model.lm_head.weight)
                else:
                    logits = model(input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False).logits
                    if mode == "chunked_logits":  # bf16 (T, V) logits, fp32 only chunk x V
                        logprobs_from_logits_chunked(logits[0], labels[0], chunk_size)
                    else:
                        logprobs_from_logits(logits[0].float(), labels[0])
                    del logits
                fed += ids.numel()
            return fed

        return run

    variants = {
        "A padded static, naive (sdpa)": padded_naive,
        f"B packed static, naive ({packed_attn})": packed("static", "naive"),
        f"C packed dynamic, naive ({packed_attn})": packed("dynamic", "naive"),
        f"D packed dynamic, chunked ({packed_attn})": packed("dynamic", "chunked"),
        f"E packed dynamic, chunked logits ({packed_attn})": packed("dynamic", "chunked_logits"),
    }
    res: dict[str, tuple[float, float]] = {}
    with torch.no_grad():
        for name, fn in variants.items():
            if time.perf_counter() - start > budget_s:
                print(f"  {name}: skipped, past --gpu-budget-s {budget_s:.0f}", flush=True)
                continue
            res[name] = _gpu_variant(fn, real, name, cuda)
    keys = list(variants)
    if keys[0] in res and keys[2] in res:
        ratio_line("C packed dynamic / A padded", res[keys[2]][0], res[keys[0]][0])
    if keys[1] in res and keys[2] in res:
        ratio_line("C packed dynamic / B packed static", res[keys[2]][0], res[keys[1]][0])
    if keys[2] in res and keys[3] in res:
        ratio_line("D chunked / C naive (speed)", res[keys[3]][0], res[keys[2]][0], 1.5)
        if cuda:
            mem = res[keys[3]][1] / res[keys[2]][1]
            verdict = "  GOAL MET" if mem <= 0.5 else "  GOAL MISSED (> 0.5)"
            print(f"  peak memory D chunked / C naive: {mem:.2f}{verdict}", flush=True)
        else:
            print("  peak memory D chunked / C naive: not measured off CUDA", flush=True)
        print(
            f"  predicted naive peak: weights + T x V x 10 B = {weights_gib + budget * V * 10 / 2**30:.1f} GiB "
            f"at T = {budget}",
            flush=True,
        )
    print(f"GPU part done in {time.perf_counter() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-rows", type=int, default=256)
    ap.add_argument("--cpu-reps", type=int, default=3)
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--skip-gpu", action="store_true")
    ap.add_argument("--gpu-seqs", type=int, default=256)
    ap.add_argument("--gpu-token-budget", type=int, default=16384)
    ap.add_argument(
        "--pad-multiple", type=int, default=2048, help="pad packed rows up to this (bounds flex recompiles)"
    )
    ap.add_argument("--chunk-size", type=int, default=2048)
    ap.add_argument("--gpu-budget-s", type=float, default=200.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--head-tokens", type=int, default=1024, help="CPU log-prob head: tokens (GPU: --gpu-token-budget)")
    ap.add_argument("--head-chunk", type=int, default=256, help="CPU log-prob head: chunk (GPU: --chunk-size)")
    ap.add_argument(
        "--gpu-dry-run-cpu", action="store_true", help="without CUDA: run the GPU code path on CPU, tiny config"
    )
    args = ap.parse_args(argv)
    if not args.skip_cpu:
        cpu_part(args.cpu_rows, args.cpu_reps, args.seed)
        head_part(args.head_tokens, args.head_chunk, args.cpu_reps, "cpu", args.seed)
    if args.skip_gpu:
        print("GPU part skipped: --skip-gpu", flush=True)
    else:
        gpu_part(
            args.gpu_seqs,
            args.gpu_token_budget,
            args.pad_multiple,
            args.chunk_size,
            args.gpu_budget_s,
            args.seed,
            args.gpu_dry_run_cpu,
        )
    heavy = sorted(m for m in ("ray", "tensordict") if m in sys.modules)
    print(f"imported ray/tensordict: {heavy or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
