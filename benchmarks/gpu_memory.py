"""The memory model against a GPU: a grid of micro-batch shapes for a Qwen2.5-0.5B-shaped model (random init),
forward log-prob and update micro-batch, predicted vs measured bytes per pass, printed as a table (and JSON).

Run: .venv/bin/python benchmarks/gpu_memory.py [--model Qwen2.5-0.5B] [--forward 8x4096,4x4096,...]
[--update 1x4096,...] [--budget-s 240] [--json out.json] [--cpu-tiny]. The model is sharded by FSDP2 on one rank
(bf16 compute, fp32 master weights, as verl's actor), packed rows (padding removed), sdpa attention, the naive fp32
log-softmax (labkit.model.logprob.forward_micro_batch), gradient checkpointing on for the update, AdamW states warm.
Measured: the CUDA allocator's peak above the state before the pass; predicted: ``labkit.memory``'s transient terms
for the same shape. Target: ±10% forward, ±20% update. Stops taking new shapes past --budget-s (partial table kept).
``--cpu-tiny``: the tiny shape on the CPU, fp32 (the smoke test). Imports no ray/tensordict (the GPU image has none).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from labkit.memory.model_catalogue import model_shape  # noqa: E402
from labkit.memory.phase_records import PassShape  # noqa: E402
from labkit.memory.phases import forward_pass, update_pass  # noqa: E402
from labkit.memory.settings import MemorySettings  # noqa: E402
from labkit.model.allocation_meter import AllocationMeter  # noqa: E402
from labkit.model.logprob import forward_micro_batch  # noqa: E402
from labkit.model.memory_check import RESIDENT, transient_bytes  # noqa: E402

TOLERANCE = {"forward": 0.10, "update": 0.20}


def _grid(text: str) -> list[tuple[int, int]]:
    out = []
    for part in filter(None, text.split(",")):
        rows, width = part.lower().split("x")
        out.append((int(rows), int(width)))
    return out


def _model(name: str, device: torch.device, bf16: bool) -> torch.nn.Module:
    """The shape as a random-init Qwen2, FSDP2-sharded on a world of one (per layer, then the root)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    m = model_shape(name)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        # one rank: an in-process store, no port that another run on the machine could hold
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads, tie_word_embeddings=m.tie_word_embeddings,
        max_position_embeddings=32768, attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    with torch.device(device):
        net = Qwen2ForCausalLM(cfg).float()
    mesh = init_device_mesh(device.type, (1,))
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    for layer in net.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(net, mesh=mesh, mp_policy=mp)
    return net


def _micro(vocab: int, rows: int, width: int, device: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows * 7919 + width)
    ids = torch.randint(1, vocab, (rows, width), generator=gen).to(device)
    pos = torch.arange(width, device=device).expand(rows, -1).contiguous()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": pos,
            "responses": ids[:, width // 2 :]}  # fmt: skip


def run(args: argparse.Namespace) -> list[dict]:
    """Every shape of the grid, forward then update; one row per pass: tokens, measured, predicted, ratio."""
    device = torch.device("cpu" if args.cpu_tiny or not torch.cuda.is_available() else "cuda")
    bf16 = device.type == "cuda"
    shape = model_shape(args.model)
    s = MemorySettings(
        model=shape, gpu_bytes=2**40, profile="engine", world_size=1, fsdp_size=-1, actor_sp=1, critic_sp=1,
        rollout_tp=1, compute_bytes=2 if bf16 else 4, master_bytes=4, attention="sdpa", logprob_kernel="full_log_softmax",
        gathered_layers=2 if bf16 else 1,
    )  # fmt: skip
    net = _model(args.model, device, bf16)
    start, rows_out = time.perf_counter(), []
    for kind, grid in (("forward", _grid(args.forward)), ("update", _grid(args.update))):
        if kind == "update":
            net.train()
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            opt = torch.optim.AdamW(net.parameters(), lr=1e-6)
        else:
            net.eval()
        for rows, width in grid:
            if time.perf_counter() - start > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: {kind} {rows}x{width} and later shapes skipped")
                break
            micro, tokens = _micro(shape.vocab_size, rows, width, device), rows * width
            if kind == "forward":
                with torch.no_grad(), AllocationMeter(device) as meter:
                    forward_micro_batch(net, micro, use_remove_padding=True, chunked=False)
                phase = forward_pass(s, "ref_log_prob", PassShape(rows, tokens))
            else:

                def step() -> None:
                    lp, _ = forward_micro_batch(net, micro, use_remove_padding=True, chunked=False)
                    (-lp.float().mean()).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                step()  # Adam states warm, as from a run's second step on
                with AllocationMeter(device) as meter:
                    step()
                phase = update_pass(s, "update_actor", PassShape(rows, tokens))
            pred = transient_bytes(phase)
            row = {"pass": kind, "rows": rows, "width": width, "tokens": tokens, "measured_bytes": meter.peak_bytes,
                   "predicted_bytes": pred, "ratio": meter.peak_bytes / pred, "peak_instant": phase.peak_instant,
                   "terms": {k: v for k, v in phase.terms.items() if k not in RESIDENT}}  # fmt: skip
            row["within"] = abs(row["ratio"] - 1) <= TOLERANCE[kind]
            rows_out.append(row)
            print(
                f"{kind:<8} {rows:>3} x {width:>6} = {tokens:>7} tokens  measured {meter.peak_bytes / 2**30:8.3f} GiB"
                f"  predicted {pred / 2**30:8.3f} GiB  ratio {row['ratio']:.3f}  {'ok' if row['within'] else 'OFF'}"
                f"  (peak at {phase.peak_instant})",
                flush=True,
            )
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"device": str(device), "model": args.model, "rows": rows_out}, f, indent=1)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows_out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="Qwen2.5-0.5B")
    p.add_argument("--forward", default="1x4096,2x4096,4x4096,8x2048,8x4096")
    p.add_argument("--update", default="1x2048,1x4096,2x4096,4x2048")
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--json", default=None)
    p.add_argument("--cpu-tiny", action="store_true", help="tiny shape on the CPU (smoke test)")
    args = p.parse_args(argv)
    if args.cpu_tiny and args.model == "Qwen2.5-0.5B":
        args.model = "tiny-qwen2"
    if not args.cpu_tiny and not torch.cuda.is_available():
        print("no CUDA device: nothing measured (run with --cpu-tiny for the CPU smoke test)")
        return 0
    rows = run(args)
    off = [r for r in rows if not r["within"]]
    print(f"{len(rows) - len(off)}/{len(rows)} passes within tolerance (forward ±10%, update ±20%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
