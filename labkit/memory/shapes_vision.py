"""A VL ``ModelShape``'s vision tower and the merger/projector that feeds its patches to the decoder.

It counts its parameters the way the Hugging Face modules hold them (transformers 5.x:
``Qwen2VisionTransformerPretrainedModel``, ``Qwen2_5_VisionTransformerPretrainedModel``, ``Qwen3VLVisionModel``,
``SiglipVisionModel`` + ``Gemma3MultiModalProjector``, GLM-4.1V's tower); tests/test_shapes.py checks every count
against those modules built on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass

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
