"""Weight sync after every actor update: the actor's FSDP2 shards gathered into full tensors, loaded into the live
rollout engine in place, the caches that still hold the old policy dropped.

For vLLM this is ``Worker.reload_weights`` (the engine's own weight loaders shard each tensor for its TP rank), then
two fixes: on the CPU backend the tied ``lm_head`` keeps the packed copy made at load time (a reload only updates
``embed_tokens``), so it is pointed at the embedding again and repacked; and ``reset_prefix_cache()``, without which
prompts of ≥ one block reuse KV computed with the old weights (verl resets it after each update).
Mirrors verl/workers/rollout/vllm_rollout/vllm_rollout.py: ServerAdapter.update_weights (weights, then
clear_kv_cache) and the FSDP side of verl/workers/fsdp_workers.py: ActorRolloutRefWorker.update_weights.
"""

from __future__ import annotations

import time
from typing import Any

import torch


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of an FSDP2 model as a full tensor (an all-gather of the shards), under the HF names."""
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = t.detach()
    return out


def digest(weights: dict[str, torch.Tensor]) -> float:
    """A float64 sum of every weight: equal on every rank when they all hold the same weights."""
    return float(sum(v.double().sum() for v in weights.values()))


def refresh_tied_lm_head(model: Any) -> bool:
    """Point the ``lm_head`` of a tied model at ``embed_tokens`` again and repack it for the CPU GEMM (vLLM's CPU
    backend keeps the copy it packed at load time otherwise). False when the model has no such pair."""
    head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None:
        return False
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    head.weight = embed.weight
    dispatch_cpu_unquantized_gemm(head, remove_weight=False)
    return True


def load_into_vllm(llm: Any, weights: dict[str, torch.Tensor], device: str, tied: bool) -> dict[str, Any]:
    """Reload ``weights`` into this rank's engine in place (external-launcher mode: the in-process worker), refresh
    a tied head on CPU, reset the prefix cache; the seconds each part took."""
    t0 = time.perf_counter()
    worker = llm.llm_engine.model_executor.driver_worker.worker
    worker.reload_weights(weights_iterator=iter(weights.items()))
    t1 = time.perf_counter()
    refreshed = tied and device == "cpu" and refresh_tied_lm_head(worker.model_runner.model)
    llm.reset_prefix_cache()
    return {"reload_s": t1 - t0, "tied_head_refreshed": bool(refreshed), "load_s": time.perf_counter() - t0}
