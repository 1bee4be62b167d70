"""What a GRPO step logs from its batch on the driver, and its progress bar: verl's data metrics (critic/score,
response_length, prompt_length, …), the weight sync's seconds and a tqdm bar when tqdm is installed. Used by ``labkit.trainer.grpo_trainer``.
Mirrors verl/trainer/ppo/metric_utils.py: compute_data_metrics.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from labkit.protocol.data_proto import DataProto


def _stats(prefix: str, v: torch.Tensor, nan_if_empty: bool) -> dict[str, float]:
    """mean/max/min of ``v``; empty: NaN (0.9.1) or torch.max's RuntimeError (0.7.1 has no empty guard)."""
    if v.numel() == 0 and nan_if_empty:
        return {f"{prefix}/{k}": float("nan") for k in ("mean", "max", "min")}
    return {f"{prefix}/mean": float(v.mean()), f"{prefix}/max": float(v.max()), f"{prefix}/min": float(v.min())}


def data_metrics(
    batch: DataProto, max_response_length: int, max_prompt_length: int, profile: str = "engine"
) -> dict[str, float]:
    """critic/score|rewards (non-aborted rows: response length > 0)|advantages|returns/{mean,max,min},
    response_length/*, response_length_non_aborted/*, response/aborted_ratio, prompt_length/* (no critic).
    Mirrors verl/trainer/ppo/metric_utils.py: compute_data_metrics(use_critic=False), in 0.7.1 and 0.9.1 alike
    except when a selection is empty: 0.9.1 logs NaN, 0.7.1 raises."""
    b, nan_ok = batch.batch, profile == "engine"
    resp_mask = b["response_mask"].bool()
    prompt_len = b["attention_mask"][:, : -b["responses"].shape[1]].sum(-1).float()
    resp_len = resp_mask.sum(-1).float()
    kept = resp_len != 0
    out: dict[str, float] = {}
    for name, seq in (("score", b["token_level_scores"].sum(-1)), ("rewards", b["token_level_rewards"].sum(-1))):
        out.update(_stats(f"critic/{name}", seq[kept], nan_ok))
    for name in ("advantages", "returns"):
        out.update(_stats(f"critic/{name}", b[name][resp_mask], nan_ok))
    if not nan_ok and not bool(kept.any()):
        raise ValueError("All samples are aborted, this should not happen.")
    for name, seq, top in (
        ("response_length", resp_len, max_response_length),
        ("response_length_non_aborted", resp_len[kept], max_response_length),
        ("prompt_length", prompt_len, max_prompt_length),
    ):
        out.update(_stats(name, seq, nan_ok))
        out[f"{name}/clip_ratio"] = float((seq == top).float().mean()) if seq.numel() else float("nan")
    out["response/aborted_ratio"] = float((~kept).float().mean())
    return out


def sync_metrics(synced: list[dict]) -> dict[str, float]:
    """The weight sync of a step, slowest rank: ``weight_sync/seconds`` (gather + load), ``weight_sync/gather_s``
    (all-gather of the FSDP2 shards), ``weight_sync/load_s`` (into the engine: vLLM's reload_weights, the tied-head
    refresh and the prefix-cache reset; HF: a fresh TP-sharded copy). labkit's names: verl logs the whole sync as
    ``timing_s/update_weights`` only."""
    out = {}
    for key in ("seconds", "gather_s", "load_s"):
        values = [float(r[key]) for r in synced if key in r]
        if values:
            out[f"weight_sync/{key}"] = max(values)
    return out


class _Progress:
    """tqdm when installed (never a new dependency), else one printed line per stage; ``on_stage(text)`` hears every
    stage too (a notebook panel's status line)."""

    def __init__(self, total: int, desc: str, enabled: bool, on_stage: Callable[[str], None] | None = None) -> None:
        self.bar, self.enabled, self.desc, self.on_stage = None, enabled, desc, on_stage
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, leave=False)
            except ImportError:
                pass

    def stage(self, name: str) -> None:
        if self.on_stage is not None:
            self.on_stage(f"{self.desc}: {name}")
        if self.bar is not None:
            self.bar.set_postfix_str(name)
        elif self.enabled:
            print(f"{self.desc}: {name} …", file=sys.stderr, flush=True)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            if self.bar.n < (self.bar.total or 0):  # it failed: the error says why, no red bar stays under it
                self.bar.total = self.bar.n
            self.bar.close()
