"""Shapes of real decoder models and capacities of real GPUs, read from ``data/model_shapes.json`` and ``data/gpus.json``.

A memory model needs the parameter count split the way FSDP holds it: the embedding, the LM head (absent when tied), and one
decoder layer at a time. The counts follow the Hugging Face modules (``Qwen2DecoderLayer``, ``Qwen3DecoderLayer``,
``LlamaDecoderLayer``): q/k/v/o projections, q/k/v biases (Qwen2), per-head q/k RMSNorm (Qwen3), a gated MLP and two RMSNorms.
RoPE has no parameters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "data"
ARCHITECTURES = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class ModelShape:
    """One model's tensor shapes, as its ``config.json`` gives them."""

    name: str
    """The key in ``data/model_shapes.json`` (e.g. ``Qwen2.5-7B``)."""
    architecture: str
    """``qwen2`` | ``qwen3`` | ``llama``: which HF decoder layer the counts follow."""
    hidden_size: int
    """H, the residual width."""
    num_hidden_layers: int
    """L, the decoder layers."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """K/V heads (GQA groups); divides the query heads."""
    head_dim: int
    """Per-head width: explicit in Qwen3 configs (128), else H / heads."""
    intermediate_size: int
    """I, the gated MLP's width."""
    vocab_size: int
    """V, rows of the embedding (and of the LM head)."""
    tie_word_embeddings: bool
    """The LM head reuses the embedding matrix (no separate V·H)."""
    attention_bias: bool
    """q/k/v projections carry biases (Qwen2/2.5, DeepSeek-R1-Distill-Qwen)."""
    qk_norm: bool
    """Per-head RMSNorm on q and k (Qwen3): head_dim weights each."""
    max_position_embeddings: int
    """The config's context limit."""
    published_params: int
    """The rounded count the model card / HF page publishes (``published_params_label``)."""
    source: str
    """Hugging Face repo id the shapes were transcribed from."""

    def embedding_param_count(self) -> int:
        """``embed_tokens``: V·H."""
        return self.vocab_size * self.hidden_size

    def lm_head_param_count(self) -> int:
        """``lm_head``: V·H, or 0 when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def layer_param_count(self) -> int:
        """One decoder layer: attention (+ biases, + q/k norms), gated MLP 3·H·I, two RMSNorms 2·H."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        return attention + 3 * h * self.intermediate_size + 2 * h

    def param_count(self) -> int:
        """Unique parameters: embedding + LM head (unless tied) + L layers + the final norm H."""
        return (
            self.embedding_param_count()
            + self.lm_head_param_count()
            + self.num_hidden_layers * self.layer_param_count()
            + self.hidden_size
        )


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's nominal memory (and dense BF16 peak where published)."""

    name: str
    """The key in ``data/gpus.json`` (e.g. ``H100-80GB``)."""
    vendor_name: str
    """The product as the vendor names it."""
    memory_label: str
    """The vendor's capacity string (``80GB HBM3``)."""
    memory_unit: str
    """How the label's GB reads: ``GiB`` (2**30 bytes) or ``GB`` (10**9)."""
    memory_bytes: int
    """Nominal capacity in bytes; the driver and CUDA context keep part of it."""
    bf16_tflops: float | None
    """Dense (no sparsity) BF16 tensor-core peak, or None when not published."""

    @property
    def memory_gib(self) -> float:
        """``memory_bytes`` in GiB."""
        return self.memory_bytes / 2**30


@cache
def _table(file: str, key: str) -> dict[str, dict[str, Any]]:
    with open(DATA / file) as f:
        return json.load(f)[key]


def _lookup(table: dict[str, dict[str, Any]], name: str, what: str, aliases: bool) -> tuple[str, dict[str, Any]]:
    wanted = name.strip().lower()
    for key, entry in table.items():
        names = {key.lower()}
        if aliases:
            names |= {entry["source"].lower(), entry["source"].rsplit("/", 1)[-1].lower()}
        if wanted in names:
            return key, entry
    raise KeyError(f"unknown {what} {name!r}; known: {', '.join(table)}")


def _build(cls: type, key: str, entry: dict[str, Any]) -> Any:
    return cls(name=key, **{f.name: entry[f.name] for f in fields(cls) if f.name != "name"})


def model_names() -> list[str]:
    """The models in ``data/model_shapes.json``, in file order."""
    return list(_table("model_shapes.json", "models"))


def gpu_names() -> list[str]:
    """The GPUs in ``data/gpus.json``, in file order."""
    return list(_table("gpus.json", "gpus"))


@cache
def model_shape(name: str) -> ModelShape:
    """The shape of ``name``: a key, its HF repo id or the repo's basename, any case. KeyError lists the known names."""
    key, entry = _lookup(_table("model_shapes.json", "models"), name, "model", aliases=True)
    return _build(ModelShape, key, entry)


@cache
def gpu(name: str) -> GpuSpec:
    """The GPU ``name`` (a key of ``data/gpus.json``, any case). KeyError lists the known names."""
    key, entry = _lookup(_table("gpus.json", "gpus"), name, "GPU", aliases=False)
    return _build(GpuSpec, key, entry)
