"""A live Ulysses SP run for the notebook: spawn ``sp`` gloo ranks on the shipped tiny model and return, as numpy and
python values, what each SP rank holds (its slice of the packed row), the all-to-all shapes, and the log-probs
against a single-process (SP=1) reference. Every rank process is joined under a timeout; errors come back as text.
Mirrors the Ulysses steps of verl/workers/actor/dp_actor.py: _forward_micro_batch and verl/utils/ulysses.py.
"""

from __future__ import annotations

import os
import queue as queue_mod
import time
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["demo_batch", "sp_slices", "run_sp_demo", "sp_rank_main"]

_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def demo_batch(
    prompt_lengths: list[int],
    response_lengths: list[int],
    prompt_width: int,
    response_width: int,
    vocab: int,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A verl-shaped micro-batch as numpy: prompts left-padded to ``prompt_width``, responses right-padded to
    ``response_width``; input_ids / attention_mask / position_ids (bsz, P+R) and responses (bsz, R)."""
    if len(prompt_lengths) != len(response_lengths):
        raise ValueError(f"{len(prompt_lengths)} prompt lengths but {len(response_lengths)} response lengths")
    if not all(1 <= p <= prompt_width for p in prompt_lengths) or not all(
        1 <= r <= response_width for r in response_lengths
    ):
        raise ValueError(f"lengths must be in [1, {prompt_width}] (prompts) and [1, {response_width}] (responses)")
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(prompt_lengths), prompt_width + response_width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        ids[i, prompt_width - p : prompt_width + r] = rng.integers(1, vocab, size=p + r)
        mask[i, prompt_width - p : prompt_width + r] = 1
    pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, prompt_width:].copy()}


def sp_slices(n_tokens: int, sp: int) -> list[list[int]]:
    """Which packed tokens (1..n_tokens; 0 = Ulysses pad) each SP rank holds after ulysses_pad_and_slice_inputs."""
    from labkit.model.ulysses import ulysses_pad_and_slice_inputs

    ids = torch.arange(1, n_tokens + 1).unsqueeze(0)
    return [ulysses_pad_and_slice_inputs(ids, None, sp_size=sp, sp_rank=r)[0][0].tolist() for r in range(sp)]


def _micro(batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.asarray(batch[k])) for k in _KEYS}


def sp_rank_main(rank: int, sp: int, port: int, payload: dict, out_q: Any) -> None:
    """One SP rank: pad+slice the demo ids, one all-to-all each way on a (bsz, seq/sp, heads, d) tensor, then the
    micro-batch's log-probs through forward_micro_batch with the SP group. Puts (rank, results) and exits."""
    res: dict[str, Any] = {}
    try:
        torch.set_num_threads(1)
        import transformers.models.qwen2.modeling_qwen2  # noqa: F401  (heavy import before the rendezvous)

        from labkit.model.logprob import forward_micro_batch
        from labkit.model.packing import pack_micro_batch
        from labkit.model.tiny_model import load_tiny_model
        from labkit.model.ulysses import apply_ulysses_patch, ulysses_pad_and_slice_inputs
        from labkit.model.ulysses_communications import SeqAllToAll
        from labkit.runtime import dist as ldist
        from labkit.runtime import meshes, process_group

        process_group.init_dist(rank, sp, port, timeout_s=payload["timeout_s"])
        group = meshes.actor_mesh(sp=sp)["sp"].get_group()
        ids = torch.tensor([payload["demo_ids"]])
        local, _, pad = ulysses_pad_and_slice_inputs(ids, None, sp_size=sp, sp_rank=rank)
        res["demo_slice"], res["demo_pad"] = local[0].tolist(), pad
        bsz, seq, heads, d = 1, 4 * sp, 2 * sp, 3
        x = torch.arange(bsz * seq * heads * d, dtype=torch.float32).view(bsz, seq, heads, d)
        x_local = x[:, rank * seq // sp : (rank + 1) * seq // sp].contiguous()
        y = SeqAllToAll.apply(group, x_local, 2, 1)  # scatter heads (dim 2), gather sequence (dim 1)
        back = SeqAllToAll.apply(group, y, 1, 2)
        res["a2a_in"], res["a2a_out"], res["a2a_back"] = tuple(x_local.shape), tuple(y.shape), tuple(back.shape)
        res["a2a_out_is_head_slice"] = bool(torch.equal(y, x[:, :, rank * heads // sp : (rank + 1) * heads // sp]))
        res["a2a_roundtrip_exact"] = bool(torch.equal(back, x_local))
        micro = _micro(payload["batch"])
        packed = pack_micro_batch(micro["input_ids"], micro["attention_mask"], micro["position_ids"])
        local_ids, _, pad_size = ulysses_pad_and_slice_inputs(
            packed.input_ids, packed.position_ids, sp_size=sp, sp_rank=rank
        )
        res["nnz"], res["pad_size"], res["local_tokens"] = packed.nnz, pad_size, int(local_ids.numel())
        model = apply_ulysses_patch(load_tiny_model(), sp)
        c0 = ldist.collective_counts()
        with torch.no_grad():
            lp, _ = forward_micro_batch(
                model, micro, use_remove_padding=True, sp_group=group, temperature=payload["temperature"]
            )
        c1 = ldist.collective_counts()
        res["collectives"] = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1 if c1.get(k, 0) - c0.get(k, 0)}
        res["log_probs"] = lp.numpy()
        ldist.barrier()
        process_group.teardown()
    except BaseException:  # report, never leave the parent waiting for its timeout
        res = {"error": traceback.format_exc()}
    report_and_exit(out_q, rank, res)


def report_and_exit(out_q: Any, rank: int, res: dict) -> None:
    """Rank side of ``spawn_ranks``: send numpy/python results (never tensors), flush, skip interpreter teardown."""
    out_q.put((rank, res))
    out_q.close()
    out_q.join_thread()
    os._exit(0)


def spawn_ranks(target: Any, world_size: int, payload: dict, timeout_s: float) -> dict[int, dict]:
    """Spawn ``target(rank, world_size, port, payload, out_q)`` on gloo ranks and collect each rank's result dict.

    Every process is joined (killed if needed) whatever happens; raises TimeoutError if a rank sends nothing within
    ``timeout_s``, RuntimeError if a rank died without a result or reported an ``error`` traceback."""
    import torch.multiprocessing as mp

    from labkit.runtime import process_group

    process_group.check_timeout("timeout_s", timeout_s)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    ctx = mp.get_context("spawn")
    out_q = ctx.Queue()
    port = process_group.free_port()
    procs = [
        ctx.Process(target=target, args=(r, world_size, port, payload, out_q), daemon=True) for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, dict] = {}
    failed = True
    try:
        deadline = time.monotonic() + timeout_s
        while len(results) < world_size:
            try:
                rank, res = out_q.get(timeout=1.0)
            except queue_mod.Empty:
                missing = sorted(set(range(world_size)) - set(results))
                dead = [r for r in missing if procs[r].exitcode is not None]
                if dead:  # a rank that died before reporting (e.g. spawn could not import the caller's __main__)
                    raise RuntimeError(
                        f"ranks {dead} exited (codes {[procs[r].exitcode for r in dead]}) "
                        "without a result; see their stderr"
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks {missing} sent nothing within {timeout_s:.0f} s") from None
                continue
            results[rank] = res
            if "error" in res:  # its peers would only wait for it (collective or rendezvous timeout): stop now
                break
        failed = any("error" in res for res in results.values())
    finally:
        out_q.close()
        for p in procs:  # after a failure, peers may sit in a collective or the rendezvous: do not wait for them
            p.join(timeout=2 if failed else 20)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    errors = {r: res["error"] for r, res in results.items() if "error" in res}
    if errors:
        raise RuntimeError(f"rank errors: {errors}")
    return dict(sorted(results.items()))


def run_sp_demo(
    batch: Mapping[str, np.ndarray],
    sp: int = 2,
    demo_ids: list[int] | None = None,
    temperature: float = 1.0,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Spawn ``sp`` gloo ranks on ``batch`` (numpy input_ids, attention_mask, position_ids (bsz, P+R), responses
    (bsz, R)); returns {"ranks": {rank: results}, "sp1_log_probs", "max_diff" (over the response mask), "wall_s"}.
    Raises TimeoutError if a rank sends nothing within ``timeout_s`` and RuntimeError with the rank's traceback."""
    from labkit.model.logprob import forward_micro_batch
    from labkit.model.tiny_model import load_tiny_model
    from labkit.model.ulysses import check_ulysses_heads
    from labkit.runtime.process_group import check_timeout

    if not isinstance(sp, int) or sp < 2:
        raise ValueError(f"run_sp_demo needs sp >= 2 ranks, got sp={sp!r}")
    check_timeout("timeout_s", timeout_s)
    model = load_tiny_model()
    check_ulysses_heads(model.config.num_attention_heads, model.config.num_key_value_heads, sp)  # E41/E42 up front
    batch = {k: np.asarray(batch[k]) for k in _KEYS}
    with torch.no_grad():
        ref, _ = forward_micro_batch(model, _micro(batch), use_remove_padding=True, temperature=temperature)
    payload = {
        "batch": batch,
        "demo_ids": list(demo_ids or range(1, 8)),
        "temperature": temperature,
        "timeout_s": min(60.0, timeout_s),
    }
    t0 = time.perf_counter()
    results = spawn_ranks(sp_rank_main, sp, payload, timeout_s)
    mask = batch["attention_mask"][:, -batch["responses"].shape[1] :].astype(bool)
    ref_np = ref.numpy()
    diff = max(float(np.abs(results[r]["log_probs"] - ref_np)[mask].max()) for r in results)
    return {"ranks": results, "sp1_log_probs": ref_np, "max_diff": diff, "wall_s": time.perf_counter() - t0}
