"""The ``hf`` rollout engine: HF ``generate`` on labkit's real TP shards of the model, inside each rollout rank.

The second engine behind ``labkit.rl.engines`` (``actor_rollout_ref.rollout.name=hf``), and the one that runs where
vLLM is not installed. Each TP rank holds 1/tp of the attention heads and MLP (``labkit.model.tp_parallel``); a
weight sync rebuilds the rollout copy from the actor's full weights and shards it again.
Mirrors verl/workers/rollout/hf_rollout.py: HFRollout (sampling through ``generate``), with TP added.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from labkit.protocol.data_proto import DataProto
from labkit.rl.rollout_output import postprocess


def load_rollout_model(model_path: str | None = None, dtype: str = "float32") -> tuple[torch.nn.Module, str]:
    """(model in eval mode, where it came from). Without ``model_path`` and without the shipped weights in
    data/tiny-qwen2, a random-init tiny Qwen2 (seed 0, identical on every rank) stands in."""
    from transformers import Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    from labkit.model import tiny_model

    hf_logging.disable_progress_bar()  # no "Loading weights" bars from every rank
    folder = Path(model_path) if model_path else tiny_model.TINY_MODEL_DIR
    if (folder / "model.safetensors").exists() or model_path:
        return tiny_model.load_tiny_model(folder, dtype=getattr(torch, dtype)), str(folder)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_model.build_config(attn_implementation="sdpa")).to(getattr(torch, dtype))
    return model.eval(), f"random init (seed 0): {folder}/model.safetensors is not there yet"


def load_tokenizer(model_path: str | None = None) -> Any:
    """The shipped tiny tokenizer, or the same recipe rebuilt in memory while data/tiny-qwen2 is not there yet."""
    from labkit.model import tiny_model

    folder = Path(model_path) if model_path else tiny_model.TINY_MODEL_DIR
    if (folder / "tokenizer.json").exists() or model_path:
        return tiny_model.load_tiny_tokenizer(folder)
    return tiny_model.build_tokenizer()


def generation_kwargs(
    do_sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    response_length: int,
    eos_token_id: int | list[int],
    pad_token_id: int,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """HF ``generate`` arguments for verl's sampling keys (top_k=-1 means off; greedy passes no warpers).

    ignore_eos (benchmarks): every row generates response_length tokens (HF min_new_tokens masks EOS until then)."""
    if response_length < 1:
        raise ValueError(f"response_length must be >= 1, got {response_length}")
    kw: dict[str, Any] = dict(
        max_new_tokens=int(response_length),
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        do_sample=bool(do_sample),
    )
    if ignore_eos:
        kw["min_new_tokens"] = int(response_length)
    if do_sample:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature} (use do_sample=False)")
        kw.update(temperature=float(temperature), top_k=max(int(top_k), 0), top_p=float(top_p))
    else:
        kw.update(temperature=None, top_k=None, top_p=None)
    return kw


class HFEngine:
    """One rank's HF rollout: the model (TP-sharded over ``tp_group``), ``generate`` with verl's sampling keys."""

    name = "hf"

    def __init__(
        self, model_path: str | None, dtype: str, tp: int, tp_group: Any, dp_rank: int, sync_logits: bool = True
    ) -> None:
        self.model_path, self.dtype, self.tp, self.tp_group = model_path, dtype, tp, tp_group
        self.dp_rank, self.sync_logits = dp_rank, sync_logits
        self.model: Any = None

    def start(self) -> dict[str, Any]:
        """Load the model and shard it over this rank's TP group."""
        from labkit.model.tp_parallel import shard_model_for_tp

        self.model, source = load_rollout_model(self.model_path, self.dtype)
        total = sum(p.numel() for p in self.model.parameters())
        digest = float(sum(p.detach().double().sum() for p in self.model.parameters()))
        if self.tp > 1:
            shard_model_for_tp(self.model, self.tp_group)
        return {
            "weights": source,
            "digest": digest,
            "params_full": total,
            "params_local": sum(p.numel() for p in self.model.parameters()),
        }

    @property
    def config(self) -> Any:
        return self.model.config

    def generate(self, prompts: DataProto, response_length: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """verl's rollout tensors for ``prompts`` (sampling settings in meta_info) and this rank's metrics."""
        from labkit.model.tp_communications import tp_collective_counts
        from labkit.model.tp_parallel import tp_generate

        meta, cfg = prompts.meta_info, self.model.config
        eos = meta.get("eos_token_id", cfg.eos_token_id)
        pad = meta.get("pad_token_id", cfg.pad_token_id if cfg.pad_token_id is not None else eos)
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        pos = (
            prompts.batch["position_ids"]
            if "position_ids" in prompts.batch.keys()
            else (mask.long().cumsum(1) - 1).clamp(min=0)
        )
        kw = generation_kwargs(
            meta.get("do_sample", True),
            meta.get("temperature", 1.0),
            meta.get("top_k", -1),
            meta.get("top_p", 1.0),
            response_length,
            eos,
            pad,
            meta.get("ignore_eos", False),
        )
        # one sampling stream per rollout replica (dp group), shared by its TP ranks so they draw identical tokens
        seed = int(meta.get("seed", 0)) * 1_000_003 + self.dp_rank
        before = tp_collective_counts()
        t0 = time.perf_counter()
        seqs = tp_generate(self.model, ids, mask, kw, seed=seed, sync_logits=self.sync_logits)
        gen_s = time.perf_counter() - t0
        tp_calls = {k: v - before.get(k, 0) for k, v in tp_collective_counts().items() if v != before.get(k, 0)}
        tensors = postprocess(ids, mask, pos, seqs, eos, pad, response_length)
        metrics = {
            "gen_s": gen_s,
            "response_tokens": int(tensors["response_length"].sum()),
            "forward_steps": int(seqs.shape[1] - ids.shape[1]),
            "tp_all_reduce": tp_calls.get("all_reduce", 0),
            "tp_broadcast": tp_calls.get("broadcast", 0),
        }
        return tensors, metrics

    def update_weights(self, full: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The actor's full weights into a fresh rollout model, TP-sharded again (the old copy is dropped)."""
        from labkit.model.tp_parallel import shard_model_for_tp

        t0 = time.perf_counter()
        model, _ = load_rollout_model(self.model_path, self.dtype)
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in full.items()}, strict=False)
        tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
        if unexpected or set(missing) - tied:
            raise RuntimeError(f"actor and rollout weights differ: missing {missing}, unexpected {unexpected}")
        if self.tp > 1:
            shard_model_for_tp(model, self.tp_group)
        self.model = model.eval()
        return {"load_s": time.perf_counter() - t0}

    def shutdown(self) -> dict[str, Any]:
        self.model = None
        return {"engine": self.name}
