"""Real rollout tensor parallelism: shard a transformers Qwen2ForCausalLM in place across a TP group, and generate.

The sharding math of labkit's rollout TP (the collectives live in ``labkit.model.tp_communications``, picotron's split). verl hands
rollout TP to vLLM, so there is no verl function to mirror; the layout is Megatron-LM's (Shoeybi et al. 2019, §3),
which vLLM also uses: q/k/v and MLP gate/up are column-parallel (each rank keeps whole heads / a block of the
intermediate columns, no communication), o_proj and down_proj are row-parallel (partial sums, one all-reduce each),
so a decoder layer costs two all-reduces in the forward. Embeddings, norms and lm_head stay replicated: the simplest
correct choice (vLLM shards the vocabulary too; at labkit's sizes the vocab is small). Every TP rank of a group
computes the same logits and returns the same tokens: one output per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import ProcessGroup

from labkit.model.tp_communications import (
    broadcast_from_tp_rank0,
    copy_to_tp_region,
    reduce_from_tp_region,
    tp_fingerprints_agree,
    tp_rank,
    tp_size,
)

__all__ = [
    "TPInfo",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "check_tp_split",
    "shard_model_for_tp",
    "sharded_param_names",
    "tp_generate",
]


@dataclass(frozen=True)
class TPInfo:
    """What ``shard_model_for_tp`` attaches to the model as ``model.labkit_tp``."""

    tp_rank: int
    tp_size: int
    group: ProcessGroup | None
    heads_per_rank: int
    kv_heads_per_rank: int
    intermediate_per_rank: int


class ColumnParallelLinear(nn.Module):
    """Megatron column-parallel linear: Y_i = X A_i, with A's output columns (rows of torch's weight) split over ranks.

    Holds only this rank's rows of ``weight`` (and ``bias``); the output stays sharded, so no forward collective.
    """

    def __init__(self, full: nn.Linear, rows: slice, group: ProcessGroup | None):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(full.weight.detach()[rows].clone(), requires_grad=full.weight.requires_grad)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[rows].clone())
        self.in_features, self.out_features = self.weight.shape[1], self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp_region(x, self.group), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, local_out={self.out_features}, bias={self.bias is not None}"


class RowParallelLinear(nn.Module):
    """Megatron row-parallel linear: Y = sum_i X_i A_i, A's input rows (columns of torch's weight) split over ranks.

    Takes the sharded output of a column-parallel layer, all-reduces the partial products, adds the bias once.
    """

    def __init__(self, full: nn.Linear, cols: slice, group: ProcessGroup | None):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone(), requires_grad=full.weight.requires_grad)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())  # replicated
        self.in_features, self.out_features = self.weight.shape[1], self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp_region(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"local_in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


def check_tp_split(config: Any, tp: int) -> None:
    """Raise ValueError unless whole attention heads, KV heads and MLP columns split evenly over ``tp`` ranks.

    Pure arithmetic on the config, so a bad split fails on every rank before any collective (never a hang).
    """
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor parallel size must be a positive int, got {tp!r}")
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % tp:  # vLLM's wording (config.verify_with_parallel_config)
        raise ValueError(
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp}) "
            f"(num_attention_heads={heads}, tensor_model_parallel_size={tp})"
        )
    if kv % tp:
        raise ValueError(
            f"the number of key-value heads ({kv}) must be divisible by tensor parallel size ({tp}): labkit's rollout "
            f"TP shards whole KV heads and does not replicate them as vLLM does when tp is a multiple of them "
            f"(num_key_value_heads={kv}, tensor_model_parallel_size={tp}; a TP that divides {kv} works)"
        )
    if config.intermediate_size % tp:
        raise ValueError(
            f"intermediate_size ({config.intermediate_size}) must be divisible by tensor parallel size ({tp}) "
            f"to split the MLP columns"
        )


def _layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") for layer in layers):
        raise TypeError(f"shard_model_for_tp expects a Qwen2ForCausalLM-like model, got {type(model).__name__}")
    return layers


def shard_model_for_tp(model: nn.Module, tp_group: ProcessGroup | None) -> nn.Module:
    """Shard ``model`` in place over ``tp_group``: this rank keeps only its heads and MLP columns; returns ``model``.

    The config is left untouched (RoPE derives head_dim from it); each attention module gets the local head counts.
    KV cache stays HF's lazily-shaped ``DynamicCache``, which then holds only this rank's KV heads.
    """
    layers = _layers(model)
    cfg = model.config
    t, r = tp_size(tp_group), tp_rank(tp_group)
    check_tp_split(cfg, t)
    if getattr(model, "labkit_tp", None) is not None:
        raise ValueError("model is already sharded for TP; shard a fresh copy")
    heads, kv = cfg.num_attention_heads // t, cfg.num_key_value_heads // t
    inter = cfg.intermediate_size // t
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        hd = attn.head_dim
        q_rows, kv_rows = slice(r * heads * hd, (r + 1) * heads * hd), slice(r * kv * hd, (r + 1) * kv * hd)
        attn.q_proj = ColumnParallelLinear(attn.q_proj, q_rows, tp_group)
        attn.k_proj = ColumnParallelLinear(attn.k_proj, kv_rows, tp_group)
        attn.v_proj = ColumnParallelLinear(attn.v_proj, kv_rows, tp_group)
        attn.o_proj = RowParallelLinear(attn.o_proj, q_rows, tp_group)
        # Local heads keep the global grouping: local q head j reads local kv head j // (heads / kv).
        attn.num_heads, attn.num_key_value_heads = heads, kv
        attn.num_key_value_groups = heads // kv
        cols = slice(r * inter, (r + 1) * inter)
        mlp.gate_proj = ColumnParallelLinear(mlp.gate_proj, cols, tp_group)
        mlp.up_proj = ColumnParallelLinear(mlp.up_proj, cols, tp_group)
        mlp.down_proj = RowParallelLinear(mlp.down_proj, cols, tp_group)
        mlp.intermediate_size = inter
    model.labkit_tp = TPInfo(r, t, tp_group, heads, kv, inter)
    return model


def sharded_param_names(model: nn.Module) -> list[str]:
    """Names of the parameters that TP splits (the weights and biases of the column/row-parallel linears)."""
    names = []
    for mod_name, mod in model.named_modules():
        if isinstance(mod, ColumnParallelLinear):
            names += [f"{mod_name}.{n}" for n, _ in mod.named_parameters()]
        elif isinstance(mod, RowParallelLinear):
            names.append(f"{mod_name}.weight")  # its bias (if any) is replicated
    return names


def tp_generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    generation_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    sync_logits: bool = True,
) -> Any:
    """HF ``generate`` on a TP-sharded (or plain) model; every TP rank returns the same tokens, one output per group.

    Sampling happens inside HF's loop, so tokens cannot be swapped after the fact the way vLLM broadcasts the
    driver's samples. Instead the sampler's inputs are made identical on every TP rank: the RNG is seeded with the
    same ``seed`` everywhere (each rank then makes the same RNG calls on the same data), and with ``sync_logits``
    each step's logits are broadcast from TP rank 0, so the tokens no longer depend on reduction order (cost: one
    batch x vocab broadcast per step). The prompts are checked equal across TP ranks before, and the outputs after.
    Reseeds the global torch RNG with ``seed``; ``generation_kwargs`` go to ``generate`` unchanged.
    """
    info: TPInfo | None = getattr(model, "labkit_tp", None)
    group = info.group if info is not None else None
    multi = info is not None and info.tp_size > 1
    if multi and not tp_fingerprints_agree(input_ids, group):
        raise RuntimeError("TP ranks were given different input_ids; every rank of a TP group needs the same prompts")
    kwargs = dict(generation_kwargs or {})
    if kwargs.get("cache_implementation", "dynamic") != "dynamic":
        raise ValueError(
            "tp_generate needs HF's DynamicCache: a preallocated cache would use the unsharded head counts"
        )
    handle = None
    if multi and sync_logits:
        handle = model.lm_head.register_forward_hook(
            lambda _m, _i, out: broadcast_from_tp_rank0(out.contiguous(), group)
        )
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    finally:
        if handle is not None:
            handle.remove()
    seqs = out if isinstance(out, torch.Tensor) else out.sequences
    if multi and not tp_fingerprints_agree(seqs, group):
        raise RuntimeError("TP ranks generated different tokens; sampling must be identical across a TP group")
    return out
