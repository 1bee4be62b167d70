"""The rollout engine's KV cache per sequence, for each kind of token mixer a decoder layer can have.

- full attention: K and V, ``2·⌈kv_heads/tp⌉·head_dim·b`` bytes per token per layer (K/V heads split over the
  engine's TP ranks, replicated when there are fewer heads than ranks);
- MLA (DeepSeek-V2/V3, Moonlight): the compressed latent and the shared RoPE key, ``(kv_lora_rank +
  qk_rope_head_dim)·b`` per token per layer, the same on every TP rank (vLLM's MLA backends cache the latent, not
  per-head K/V);
- sliding-window attention (gpt-oss, Gemma): full attention's bytes, for at most ``sliding_window`` tokens of a
  sequence (vLLM frees the blocks that leave the window);
- linear attention (Qwen3-Next / Qwen3.5 gated delta-net): no per-token KV, a fixed state per sequence: the
  recurrent state (value heads × key dim × value dim) and the causal conv's last ``kernel − 1`` inputs, heads split
  over TP;
- Mamba2 (Nemotron-H): likewise a fixed state per sequence, each head's SSM state (heads × head_dim × state_size,
  fp32 as the config's ``mamba_ssm_cache_dtype`` says) and the conv's last ``kernel − 1`` inputs; MoE and MLP
  blocks cache nothing;
- DeepSeek-V4: one shared K/V head of ``head_dim`` in every layer's 128-token sliding window, and on a compressed
  layer one entry per ``rate`` tokens (CSA: ``head_dim`` plus the indexer's ``index_head_dim`` every 4 tokens; HCA:
  ``head_dim`` every 128), the same on every TP rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from labkit.memory.shapes import ModelShape


@dataclass(frozen=True)
class KvLayout:
    """One TP rank's cache bytes for one sequence, by layer kind."""

    per_token: int
    """Bytes per token of the full-attention and MLA layers (every token of the sequence is kept)."""
    window_per_token: int
    """Bytes per token of the sliding-window layers (kept for at most ``window`` tokens)."""
    window: int
    """The sliding window (0: no such layers)."""
    state: int
    """Fixed bytes per sequence of the linear-attention and Mamba2 layers."""
    kinds: dict[str, int]
    """How many layers of each kind: ``full_attention``, ``mla``, ``sliding_attention``, ``linear_attention``,
    ``mamba``."""

    def sequence_bytes(self, length: int) -> int:
        """One sequence of ``length`` tokens."""
        return self.per_token * length + self.window_per_token * min(length, self.window or length) + self.state


def _heads(n: int, tp: int) -> int:
    return max(1, -(-n // tp)) if n >= tp else 1


@lru_cache(maxsize=256)
def kv_layout(m: ModelShape, b: int, tp: int) -> KvLayout:
    """The cache of ``m`` on one of ``tp`` ranks, ``b`` bytes per cached value."""
    kinds: dict[str, int] = {}
    per_token = window_per_token = state = 0
    full = 2 * _heads(m.num_key_value_heads, tp) * m.head_dim * b
    for i in range(m.num_hidden_layers):
        kind = m.layer_type(i)
        if not m.has_mixer(i):
            continue
        if m.compressed_attention is not None:
            ca = m.compressed_attention
            window_per_token += m.head_dim * b
            if kind == "compressed_sparse_attention":
                per_token += b * (m.head_dim + ca.index_head_dim) // ca.csa_rate
            elif kind == "heavily_compressed_attention":
                per_token += b * m.head_dim // ca.hca_rate
        elif kind == "mamba" and m.mamba is not None:
            mb = m.mamba
            heads = _heads(mb.num_heads, tp)
            state += (
                4 * heads * mb.head_dim * mb.state_size + b * (mb.conv_kernel - 1) * mb.conv_dim * heads // mb.num_heads
            )
        elif kind == "linear_attention" and m.linear_attention is not None:
            la = m.linear_attention
            nv = _heads(la.num_value_heads, tp)
            nk = _heads(la.num_key_heads, tp)
            conv = (la.conv_kernel_size - 1) * (2 * nk * la.key_head_dim + nv * la.value_head_dim)
            state += b * (nv * la.key_head_dim * la.value_head_dim + conv)
        elif m.mla is not None:
            kind = "mla"
            per_token += (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * b
        elif kind == "sliding_attention" and m.sliding_window:
            window_per_token += full
        else:
            kind = "full_attention"
            per_token += full
        kinds[kind] = kinds.get(kind, 0) + 1
    return KvLayout(per_token, window_per_token, m.sliding_window if window_per_token else 0, state, kinds)
