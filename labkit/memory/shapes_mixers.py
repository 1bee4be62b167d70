"""A ``ModelShape``'s token mixers other than plain q/k/v/o attention: DeepSeek's multi-head latent attention, the
gated delta-net (linear attention) layers of Qwen3-Next / Qwen3.5, Nemotron-H's Mamba2 mixer and DeepSeek-V4's
compressed attention with its hyper-connections.

Each counts its parameters the way the Hugging Face modules hold them (transformers 5.x: ``DeepseekV3Attention``,
``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet``, ``NemotronHMamba2Mixer``, ``DeepseekV4Attention``);
tests/test_shapes.py checks every count against those modules built on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MlaShape:
    """DeepSeek-V2/V3 multi-head latent attention (``DeepseekV3Attention``): queries through an optional low-rank
    ``q_a_proj``/``q_b_proj``, keys and values through a shared latent of ``kv_lora_rank`` plus a decoupled RoPE key."""

    q_lora_rank: int
    """Rank of the query compression; 0 when the config says null (V2-Lite, Moonlight: a full ``q_proj``)."""
    kv_lora_rank: int
    """Width of the compressed K/V latent (the per-token KV cache holds kv_lora_rank + qk_rope_head_dim)."""
    qk_nope_head_dim: int
    """Per-head query/key width without RoPE."""
    qk_rope_head_dim: int
    """Per-head RoPE width (one key shared by all heads)."""
    v_head_dim: int
    """Per-head value width."""

    def param_count(self, hidden: int, heads: int, bias: bool = False) -> int:
        """q (``q_proj`` H·n·(nope+rope), or ``q_a_proj`` H·r + its RMSNorm r + ``q_b_proj`` r·n·(nope+rope)),
        ``kv_a_proj_with_mqa`` H·(kv_rank+rope), its RMSNorm kv_rank, ``kv_b_proj`` kv_rank·n·(nope+v) and ``o_proj``
        n·v·H; ``bias`` (config attention_bias) adds the biases of q_a_proj, kv_a_proj and o_proj."""
        qk = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        r, kv_a = self.q_lora_rank, self.kv_lora_rank + self.qk_rope_head_dim
        q = hidden * r + r + r * qk + (r if bias else 0) if r else hidden * qk
        kv = hidden * kv_a + self.kv_lora_rank + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        o = heads * self.v_head_dim * hidden
        return q + kv + o + ((kv_a + hidden) if bias else 0)


@dataclass(frozen=True)
class LinearAttentionShape:
    """The gated delta-net token mixer of Qwen3-Next / Qwen3.5 (``Qwen3NextGatedDeltaNet``): no KV cache, a
    fixed-size recurrent state per head instead."""

    num_key_heads: int
    """``linear_num_key_heads``."""
    num_value_heads: int
    """``linear_num_value_heads``."""
    key_head_dim: int
    """``linear_key_head_dim``."""
    value_head_dim: int
    """``linear_value_head_dim``."""
    conv_kernel_size: int
    """``linear_conv_kernel_dim``: the depthwise causal conv over q, k and v."""

    def param_count(self, hidden: int) -> int:
        """q/k/v/z input projection H·(2·K + 2·V), b/a projection H·2·nv, the depthwise conv (2·K + V)·kernel,
        ``dt_bias`` and ``A_log`` nv each, the gated RMSNorm v_head_dim and ``out_proj`` V·H (K, V: key/value widths)."""
        k, v, nv = (
            self.num_key_heads * self.key_head_dim,
            self.num_value_heads * self.value_head_dim,
            self.num_value_heads,
        )
        return (
            hidden * (2 * k + 2 * v)
            + hidden * 2 * nv
            + (2 * k + v) * self.conv_kernel_size
            + 2 * nv
            + (self.value_head_dim)
            + v * hidden
        )


@dataclass(frozen=True)
class MambaShape:
    """The Mamba2 mixer of Nemotron-H's ``M`` blocks (``NemotronHMamba2Mixer``): no KV cache, a fixed state per
    sequence (each head's ``state_size``-wide SSM state and the causal conv's last ``conv_kernel - 1`` inputs)."""

    num_heads: int
    """``mamba_num_heads``."""
    head_dim: int
    """``mamba_head_dim``: the inner width is heads × head_dim."""
    state_size: int
    """``ssm_state_size``."""
    n_groups: int
    """``n_groups``: B and C are shared within each group of heads."""
    conv_kernel: int
    """``conv_kernel``: the depthwise causal conv over x, B and C."""
    conv_bias: bool = True
    """``use_conv_bias``."""
    proj_bias: bool = False
    """``use_bias``: biases on in_proj and out_proj."""

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the conv: x (inner) and the groups' B and C."""
        return self.inner + 2 * self.n_groups * self.state_size

    def param_count(self, hidden: int) -> int:
        """``in_proj`` H·(inner + conv_dim + heads) (z, x/B/C, dt), the depthwise conv conv_dim·kernel (+ bias),
        ``dt_bias``, ``A_log`` and ``D`` per head, the gated RMSNorm inner, ``out_proj`` inner·H."""
        d, c = self.inner, self.conv_dim
        projections = (
            hidden * (d + c + self.num_heads)
            + d * hidden
            + ((d + c + self.num_heads + hidden) if self.proj_bias else 0)
        )
        return projections + c * self.conv_kernel + (c if self.conv_bias else 0) + 3 * self.num_heads + d


V4_COMPRESSED = {"compressed_sparse_attention": "csa_rate", "heavily_compressed_attention": "hca_rate"}
"""DeepSeek-V4's compressed layer kinds and the field holding each one's compression rate."""


@dataclass(frozen=True)
class V4AttentionShape:
    """DeepSeek-V4's attention (``DeepseekV4Attention``): shared-KV multi-query attention (one KV head of
    ``head_dim``) with a low-rank query, per-head sinks and a grouped low-rank output, a 128-token sliding window in
    every layer, and on CSA / HCA layers a compressor of the KV every ``rate`` tokens (CSA adds a lightning indexer
    picking ``index_topk`` compressed entries); plus the manifold-constrained hyper-connections (``hc_mult``
    residual streams) around every attention and MoE block and before the head."""

    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    """The grouped output projection: heads·head_dim in ``o_groups`` blocks, each to ``o_lora_rank``."""
    index_n_heads: int
    index_head_dim: int
    csa_rate: int
    """``compress_ratios`` 4: compressed sparse attention."""
    hca_rate: int
    """``compress_ratios`` 128: heavily compressed attention."""
    hc_mult: int
    """Hyper-connection residual streams."""

    def param_count(self, hidden: int, heads: int, head_dim: int, kind: str) -> int:
        """q_a (+ its norm), q_b, kv_proj (+ norm), the grouped o_a and o_b, the sinks; a compressor's kv and gate
        projections (CSA: 2·head_dim wide, overlapping windows), position bias and norm; CSA's indexer (its q_b from
        the query latent, weights, its own compressor); the two hyper-connection mixers of the layer."""
        r, o = self.q_lora_rank, self.o_groups * self.o_lora_rank
        n = hidden * r + r + r * heads * head_dim + hidden * head_dim + head_dim
        n += heads * head_dim * self.o_lora_rank + o * hidden + heads
        if kind == "compressed_sparse_attention":
            n += self._compressor(hidden, 2 * head_dim, self.csa_rate) + head_dim
            idx = self.index_n_heads * self.index_head_dim
            n += (
                r * idx + hidden * self.index_n_heads + self._compressor(hidden, 2 * self.index_head_dim, self.csa_rate)
            )
            n += self.index_head_dim
        elif kind == "heavily_compressed_attention":
            n += self._compressor(hidden, head_dim, self.hca_rate) + head_dim
        return n + 2 * self.hc_param_count(hidden)

    @staticmethod
    def _compressor(hidden: int, width: int, rate: int) -> int:
        return 2 * hidden * width + rate * width

    def hc_param_count(self, hidden: int) -> int:
        """One hyper-connection mixer: fn ((2 + m)·m rows of m·H), base and 3 scales."""
        m = self.hc_mult
        rows = (2 + m) * m
        return rows * m * hidden + rows + 3

    def head_param_count(self, hidden: int) -> int:
        """The head's hyper-connection, collapsing the streams: m rows of m·H, m bases, one scale."""
        m = self.hc_mult
        return m * m * hidden + m + 1
