"""The optional parts of a ``ModelShape``: a mixture-of-experts MLP, DeepSeek's multi-head latent attention, the gated
delta-net (linear attention) layers of Qwen3-Next / Qwen3.5, Nemotron-H's Mamba2 mixer, DeepSeek-V4's compressed
attention, and a vision tower with its merger.

Each part counts its own parameters the way the Hugging Face modules hold them (transformers 5.x:
``Qwen2MoeSparseMoeBlock``, ``Qwen3MoeSparseMoeBlock``, ``DeepseekV3MoE``, ``GptOssMLP``, ``MixtralSparseMoeBlock``,
``DeepseekV3Attention``, ``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet``, ``NemotronHMamba2Mixer``, ``DeepseekV4Attention``, ``Qwen2VisionTransformerPretrainedModel``,
``Qwen2_5_VisionTransformerPretrainedModel``, ``Qwen3VLVisionModel``, ``SiglipVisionModel`` + ``Gemma3MultiModalProjector``);
tests/test_shapes.py checks every count against those modules built on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeShape:
    """A sparse MLP: ``num_experts`` routed experts of width ``moe_intermediate_size`` (each a gated MLP, 3·H·I), a
    router picking ``num_experts_per_tok`` of them per token, and optional always-on shared experts."""

    num_experts: int
    """Routed experts per MoE layer (config ``num_experts`` / ``n_routed_experts`` / ``num_local_experts``)."""
    num_experts_per_tok: int
    """Top-k: routed experts each token runs through."""
    moe_intermediate_size: int
    """One routed expert's gated-MLP width (config ``moe_intermediate_size``; Mixtral/gpt-oss ``intermediate_size``)."""
    shared_expert_intermediate_size: int = 0
    """Total width of the shared expert(s), every token runs them: Qwen2-MoE/Qwen3-Next ``shared_expert_intermediate_size``;
    DeepSeek/GLM/Moonlight ``n_shared_experts * moe_intermediate_size`` (one fused gated MLP of that width). 0: none."""
    shared_expert_gate: bool = False
    """Qwen2-MoE / Qwen3-Next / Qwen3.5: a sigmoid gate ``Linear(H, 1)`` scales the shared expert (H params)."""
    router_bias: bool = False
    """The router ``Linear(H, E)`` has a bias (gpt-oss): E more parameters."""
    router_score_bias: bool = False
    """DeepSeek-V3 / GLM-4.5 / Moonlight ``e_score_correction_bias`` (E values, a checkpoint tensor, a buffer in HF)."""
    expert_bias: bool = False
    """Each expert's projections carry biases (gpt-oss: 2·I on gate_up, H on down)."""
    first_k_dense_replace: int = 0
    """The first k layers keep the dense MLP (DeepSeek, GLM-4.5, Moonlight; Qwen3-Next-style configs say 0)."""
    decoder_sparse_step: int = 1
    """Qwen2/3-MoE: layer i is MoE when (i + 1) % step == 0."""
    mlp_only_layers: tuple[int, ...] = ()
    """Qwen2/3-MoE: layer indices forced dense (Hy3: its ``dense`` layers; Nemotron-H: every block but its MoE ones)."""
    hash_layers: int = 0
    """DeepSeek-V4: the first layers route each token by a frozen token → expert table (no score-correction bias)."""
    gated: bool = True
    """Experts and shared expert are gated MLPs (gate, up, down); Nemotron-H's are up and down only (squared ReLU)."""

    @property
    def projections(self) -> int:
        """Weight matrices per expert: 3 gated, 2 not."""
        return 3 if self.gated else 2

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based) holds this sparse MLP (else the dense one, ``intermediate_size``):
        the HF rule ``index >= first_k_dense_replace and (index + 1) % decoder_sparse_step == 0 and index not in
        mlp_only_layers``."""
        return (
            index >= self.first_k_dense_replace
            and (index + 1) % self.decoder_sparse_step == 0
            and index not in self.mlp_only_layers
        )

    def expert_param_count(self, hidden: int) -> int:
        """One routed expert: gate, up and down projections 3·H·I (+ 2·I + H biases for gpt-oss)."""
        i = self.moe_intermediate_size
        return self.projections * hidden * i + ((2 * i + hidden) if self.expert_bias else 0)

    def router_param_count(self, hidden: int) -> int:
        """The router (gate) ``Linear(H, E)``, its bias (gpt-oss) and DeepSeek-V3's score-correction bias."""
        e = self.num_experts
        return hidden * e + (e if self.router_bias else 0) + (e if self.router_score_bias else 0)

    def shared_param_count(self, hidden: int) -> int:
        """The shared expert(s): a gated MLP of the total shared width, plus Qwen's ``Linear(H, 1)`` gate."""
        shared = self.projections * hidden * self.shared_expert_intermediate_size
        return shared + (hidden if self.shared_expert_gate else 0)

    def block_param_count(self, hidden: int) -> int:
        """The whole sparse MLP of one layer: router + all routed experts + shared expert(s)."""
        return (
            self.router_param_count(hidden)
            + self.num_experts * self.expert_param_count(hidden)
            + self.shared_param_count(hidden)
        )

    def active_block_param_count(self, hidden: int) -> int:
        """What one token runs in one layer: router + top-k routed experts + shared expert(s)."""
        return (
            self.router_param_count(hidden)
            + self.num_experts_per_tok * self.expert_param_count(hidden)
            + self.shared_param_count(hidden)
        )


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


VISION_KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "siglip", "glm4v")


@dataclass(frozen=True)
class VisionShape:
    """A vision tower and the merger/projector that feeds its patches to the decoder (all counted, all trained unless
    verl freezes them)."""

    kind: str
    """``qwen2_vl`` (LayerNorm, quick-GELU MLP), ``qwen2_5_vl`` (RMSNorm, gated MLP), ``qwen3_vl`` (LayerNorm, learned
    position table, DeepStack mergers), ``siglip`` (Gemma 3's SigLIP + ``Gemma3MultiModalProjector``), ``glm4v``
    (GLM-4.1V: RMSNorm blocks with a gated MLP of width ``out_hidden_size``, a strided-conv downsample and a gated
    merger of width ``intermediate_size``)."""
    hidden_size: int
    """The tower's width (Qwen2-VL ``embed_dim``)."""
    depth: int
    """Transformer blocks."""
    num_heads: int
    """Attention heads (no parameters of their own)."""
    intermediate_size: int
    """MLP width (Qwen2-VL: embed_dim·mlp_ratio; GLM-4.1V: the merger's gated-MLP width)."""
    patch_size: int
    """Pixels per patch side."""
    spatial_merge_size: int
    """Patches merged per side before the decoder (Qwen: 2, so 4 patches a token); Gemma 3: 1 (it pools)."""
    out_hidden_size: int
    """The decoder width the merger/projector maps to."""
    temporal_patch_size: int = 1
    """Frames per patch (Qwen's Conv3d: 2)."""
    in_channels: int = 3
    """Image channels."""
    num_position_embeddings: int = 0
    """Learned position table rows (Qwen3-VL 2304, SigLIP (image/patch)^2); 0: rotary only."""
    deepstack_layers: int = 0
    """Qwen3-VL: extra mergers feeding features of these many blocks into the first decoder layers."""

    def block_param_count(self) -> int:
        """One tower block: two norms, qkv and proj (with biases), the MLP (with biases)."""
        d, i = self.hidden_size, self.intermediate_size
        if self.kind == "glm4v":  # RMSNorms, unbiased qkv/proj, gated MLP of width out_hidden_size, no biases
            return 2 * d + 4 * d * d + 3 * d * self.out_hidden_size
        norms = 2 * d if self.kind == "qwen2_5_vl" else 4 * d
        mlp = 3 * d * i + 2 * i + d if self.kind == "qwen2_5_vl" else 2 * d * i + i + d
        return norms + 4 * d * d + 4 * d + mlp

    def merger_param_count(self) -> int:
        """The merger (Qwen: a norm, Linear(4d, 4d) and Linear(4d, out), biased; Qwen3-VL adds its DeepStack mergers
        with a norm over 4d) or Gemma 3's projector (an RMSNorm d and a d×out matrix)."""
        d, out = self.hidden_size, self.out_hidden_size
        if self.kind == "siglip":
            return d + d * out
        if self.kind == "glm4v":  # post-LayerNorm d, conv downsample d->out (biased), proj + LayerNorm + gated MLP
            downsample = d * out * self.spatial_merge_size**2 + out
            return d + downsample + out * out + 2 * out + 3 * out * self.intermediate_size
        m = d * self.spatial_merge_size**2
        mlp = m * m + m + m * out + out
        norm = d if self.kind == "qwen2_5_vl" else 2 * d
        return norm + mlp + self.deepstack_layers * (2 * m + mlp)

    def embedding_param_count(self) -> int:
        """Patch embedding (a conv, biased except Qwen2/2.5-VL's), the learned position table, SigLIP's final LayerNorm."""
        d = self.hidden_size
        conv = self.in_channels * self.temporal_patch_size * self.patch_size**2 * d
        conv += 0 if self.kind in ("qwen2_vl", "qwen2_5_vl") else d
        post = 2 * d if self.kind == "siglip" else d if self.kind == "glm4v" else 0  # glm4v: post-conv RMSNorm
        return conv + self.num_position_embeddings * d + post

    def param_count(self) -> int:
        """The exact tower + merger/projector parameter count."""
        return self.embedding_param_count() + self.depth * self.block_param_count() + self.merger_param_count()
