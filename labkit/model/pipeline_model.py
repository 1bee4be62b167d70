"""The tiny Qwen2 cut into pipeline chunks, in plain torch, and a meter of the activations autograd keeps alive.

megatron-core builds each pipeline stage's share of the decoder (``megatron/core/transformer/transformer_block.py:
get_num_layers_to_build``): L / (PP·V) consecutive layers per model chunk, chunk c of stage r being virtual stage
v = c·PP + r; the embedding lives on virtual stage 0, the final norm, the output layer and the loss on the last one.
``pipeline_chunks`` does the same with the shipped tiny Qwen2's weights (``data/tiny-qwen2``), its decoder layers
repeated to L (the shipped 3 do not divide by 4 stages). The layers are written in plain torch (RMSNorm, rotary GQA
attention, SwiGLU MLP, as ``transformers``' Qwen2) so a rank process does not import ``transformers``.

``SavedActivations`` counts the bytes autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``),
live: a micro-batch's bytes appear during its forward and leave when its backward frees the graph. That is the
activation memory the pipeline schedule multiplies (``megatron/core/pipeline_parallel/schedules.py``: a stage keeps
its in-flight micro-batches' graphs until their backward).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from labkit.model.tiny_model import TINY_CONFIG, TINY_MODEL_DIR

__all__ = ["ChunkSpec", "PipelineChunk", "SavedActivations", "chunk_specs", "pipeline_chunks", "check_pipeline_split"]


def check_pipeline_split(num_layers: int, pp: int, vpp: int | None) -> None:
    """megatron-core's layer checks (``transformer_block.py: get_num_layers_to_build``), its text verbatim."""
    if num_layers % pp:
        raise ValueError("num_layers should be divisible by pipeline_model_parallel_size")
    if vpp and (num_layers // pp) % vpp:
        raise ValueError(
            f"num_layers_per_pipeline_rank {num_layers // pp}             should be divisible by vp_size {vpp}"
        )


@dataclass(frozen=True)
class ChunkSpec:
    """One model chunk: its virtual stage, the pipeline stage holding it, its chunk index and layer indices."""

    virtual_stage: int
    stage: int
    chunk: int
    layers: tuple[int, ...]
    first: bool
    last: bool


def chunk_specs(num_layers: int, pp: int, vpp: int | None = None) -> list[ChunkSpec]:
    """Every virtual stage's chunk, in virtual-stage order: L/(PP·V) consecutive layers each."""
    check_pipeline_split(num_layers, pp, vpp)
    v = vpp or 1
    per = num_layers // (pp * v)
    return [
        ChunkSpec(vs, vs % pp, vs // pp, tuple(range(vs * per, (vs + 1) * per)), vs == 0, vs == pp * v - 1)
        for vs in range(pp * v)
    ]


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(hidden)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class DecoderLayer(nn.Module):
    """One Qwen2 decoder layer (pre-norm attention with q/k/v biases and rotary embeddings, then a SwiGLU MLP)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, self.heads, self.kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = h // self.heads
        self.input_layernorm = RMSNorm(h, cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(h, cfg["rms_norm_eps"])
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, self.heads * self.hd)
        self.self_attn.k_proj = nn.Linear(h, self.kv * self.hd)
        self.self_attn.v_proj = nn.Linear(h, self.kv * self.hd)
        self.self_attn.o_proj = nn.Linear(self.heads * self.hd, h, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, cfg["intermediate_size"], bias=False)
        self.mlp.up_proj = nn.Linear(h, cfg["intermediate_size"], bias=False)
        self.mlp.down_proj = nn.Linear(cfg["intermediate_size"], h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        a, y = self.self_attn, self.input_layernorm(x)
        q = a.q_proj(y).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = a.k_proj(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = a.v_proj(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(self.hd))
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, s, -1))
        m = self.mlp
        y = self.post_attention_layernorm(x)
        return x + m.down_proj(F.silu(m.gate_proj(y)) * m.up_proj(y))


class PipelineChunk(nn.Module):
    """One virtual stage: (embedding on the first) + its decoder layers + (final norm, output layer, loss on the last).

    ``forward(x)`` takes token ids [b, s] on the first chunk, hidden states [b, s, h] elsewhere; the last chunk returns
    the mean next-token cross-entropy when given ``labels``, its logits otherwise."""

    def __init__(self, spec: ChunkSpec, cfg: dict[str, Any] = TINY_CONFIG) -> None:
        super().__init__()
        self.spec, h = spec, cfg["hidden_size"]
        if spec.first:
            self.embed_tokens = nn.Embedding(cfg["vocab_size"], h)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in spec.layers)
        if spec.last:
            self.norm = RMSNorm(h, cfg["rms_norm_eps"])
            self.lm_head = nn.Linear(h, cfg["vocab_size"], bias=False)  # a copy of the tied embedding
        hd = h // cfg["num_attention_heads"]
        self.register_buffer(
            "inv_freq", 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd), persistent=False
        )

    def rope(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.arange(s, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed_tokens(x) if self.spec.first else x
        cos, sin = self.rope(h.shape[1])
        for layer in self.layers:
            h = layer(h, cos, sin)
        if not self.spec.last:
            return h
        logits = self.lm_head(self.norm(h))
        if labels is None:
            return logits
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def _tiny_state() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(TINY_MODEL_DIR / "model.safetensors"))


def pipeline_chunks(
    num_layers: int, pp: int, vpp: int | None, stage: int | None = None, state: dict[str, torch.Tensor] | None = None
) -> list[PipelineChunk]:
    """The model chunks of pipeline stage ``stage`` (all virtual stages when None), in chunk order, loaded from the
    tiny Qwen2: decoder layer i takes the shipped layer i mod 3; the last chunk's output layer is a copy of the tied
    embedding (megatron-core keeps one on the first and one on the last stage)."""
    state = _tiny_state() if state is None else state
    shipped = TINY_CONFIG["num_hidden_layers"]
    out = []
    for spec in chunk_specs(num_layers, pp, vpp):
        if stage is not None and spec.stage != stage:
            continue
        chunk = PipelineChunk(spec)
        own: dict[str, torch.Tensor] = {}
        for j, layer in enumerate(spec.layers):
            prefix = f"model.layers.{layer % shipped}."
            own |= {f"layers.{j}.{k[len(prefix) :]}": v for k, v in state.items() if k.startswith(prefix)}
        if spec.first:
            own["embed_tokens.weight"] = state["model.embed_tokens.weight"]
        if spec.last:
            own["norm.weight"] = state["model.norm.weight"]
            own["lm_head.weight"] = state.get("lm_head.weight", state["model.embed_tokens.weight"])
        chunk.load_state_dict({k: v.clone() for k, v in own.items()}, strict=True)
        out.append(chunk)
    return out


class _Held:
    """What autograd stores for one saved tensor while the meter runs; its end is the graph's release."""

    __slots__ = ("tensor", "meter", "key", "tag")

    def __init__(self, tensor: torch.Tensor, meter: SavedActivations, key: int, tag: Any) -> None:
        self.tensor, self.meter, self.key, self.tag = tensor, meter, key, tag

    def __del__(self) -> None:
        self.meter._release(self.key, self.tag)


class SavedActivations:
    """Live bytes of the tensors autograd saved for backward inside ``record(tag)`` blocks, by tag.

    A storage saved several times counts once; parameters (and views of them) are not activations and are skipped.
    ``live`` is the total now, ``peak`` the highest total seen, ``by_tag`` the live bytes of each tag (a tag is a
    (micro-batch, chunk) of the schedule)."""

    def __init__(self, params: Iterator[torch.Tensor] | list[torch.Tensor] = ()) -> None:
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.live = self.peak = 0
        self.by_tag: dict[Any, int] = {}
        self._refs: dict[int, list] = {}  # storage pointer -> [count, bytes, tag]

    def _pack(self, t: torch.Tensor, tag: Any) -> Any:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.skip or t.numel() == 0:
            return t
        ref = self._refs.get(key)
        if ref is None:
            ref = self._refs[key] = [0, storage.nbytes(), tag]
            self.live += ref[1]
            self.by_tag[tag] = self.by_tag.get(tag, 0) + ref[1]
            self.peak = max(self.peak, self.live)
        ref[0] += 1
        return _Held(t, self, key, ref[2])

    def _release(self, key: int, tag: Any) -> None:
        ref = self._refs.get(key)
        if ref is None:
            return
        ref[0] -= 1
        if ref[0] == 0:
            del self._refs[key]
            self.live -= ref[1]
            self.by_tag[tag] -= ref[1]
            if not self.by_tag[tag]:
                del self.by_tag[tag]

    @contextmanager
    def record(self, tag: Any) -> Iterator[None]:
        """Count what autograd saves inside the block under ``tag``."""

        def pack(t: torch.Tensor) -> Any:
            return self._pack(t, tag)

        def unpack(x: Any) -> torch.Tensor:
            return x.tensor if isinstance(x, _Held) else x

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    @property
    def in_flight(self) -> int:
        """Tags whose saved tensors are still alive."""
        return len(self.by_tag)


def chunk_activation_bytes(
    num_layers: int, pp: int, vpp: int | None, rows: int, seq_len: int, seed: int = 0
) -> list[int]:
    """Bytes one micro-batch of ``rows`` × ``seq_len`` tokens leaves saved for backward on each virtual stage (one
    forward per chunk, measured by ``SavedActivations``): the unit the schedule multiplies by its in-flight count."""
    torch.manual_seed(seed)
    chunks = pipeline_chunks(num_layers, pp, vpp)
    ids = torch.randint(0, TINY_CONFIG["vocab_size"], (rows, seq_len))
    out, x = [], ids
    for chunk in chunks:
        meter = SavedActivations(chunk.parameters())
        if not chunk.spec.first:
            x = x.detach().requires_grad_(True)
        with meter.record(0):
            y = chunk(x, ids if chunk.spec.last else None)
        out.append(meter.live)
        x = y
        del y
    return out
