"""The vision tower of a VL model in the actor's passes (Qwen2-VL / Qwen2.5-VL / Qwen3-VL, Gemma 3's SigLIP, GLM-4.1V).

Its parameters are in ``ModelShape.param_count`` (FSDP shards them like the rest; each vision block is an FSDP unit
of its own, smaller than a decoder layer, so the gathered copies are the decoder's). Its activations depend on how
many image tokens each sample has, which sequence lengths cannot say: ``MemorySettings.image_tokens_per_sample`` is
that assumption, stated in the phase's ``info``. Each image token of the decoder is ``spatial_merge_size²``
patches of the tower (Qwen's merger; SigLIP pools, 1). The tower runs before the decoder (verl's forward passes
``pixel_values``) under bf16 autocast, so its norms read fp32 copies. Every figure below is bytes per patch, read
off transformers' Qwen-VL towers traced op by op (``labkit.model.trace_vision``); SigLIP and GLM-4.1V are priced by
the same rules from their block layout (APPROXIMATED: not traced).
"""

from __future__ import annotations

from labkit.memory.shapes import ModelShape
from labkit.memory.shapes_vision import VisionShape

RMS_NORMS = ("qwen2_5_vl", "glm4v")
"""Towers whose blocks use an RMSNorm (an fp32 copy, its bf16 cast and the weighted output are saved); the others'
LayerNorm saves its fp32 input copy, and the next linear its bf16 cast of the fp32 output."""
ROTARY = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v")
"""Towers with 2-D rotary positions: fp32 cos/sin for every patch, and q, k rotated in fp32."""


def vision_patches(m: ModelShape, rows: int, image_tokens_per_sample: int) -> int:
    """Patches the tower sees for a micro-batch of ``rows`` samples (0 for a text-only model)."""
    if m.vision is None:
        return 0
    return rows * image_tokens_per_sample * m.vision.spatial_merge_size**2


def _norm_saved(v: VisionShape, width: int, b: int) -> int:
    """What a norm over ``width`` and the linear after it keep for backward, per row."""
    return 4 * width + (2 * b * width if v.kind in RMS_NORMS else b * width)


def _mlp_saved(v: VisionShape, b: int) -> int:
    """The block MLP's saved tensors: gated (gate, up, SiLU, product), quick-GELU (fc1, sigmoid, product) or GELU
    (fc1 and its activation)."""
    if v.kind == "qwen2_5_vl":
        return 4 * b * v.intermediate_size
    if v.kind == "glm4v":  # its block MLP is out_hidden_size wide
        return 4 * b * v.out_hidden_size
    return (3 if v.kind == "qwen2_vl" else 2) * b * v.intermediate_size


def _head_dim(v: VisionShape) -> int:
    return v.hidden_size // v.num_heads


def block_saved_bytes(v: VisionShape, b: int) -> int:
    """One block without checkpointing, per patch: two norms, qkv, the rotated q and k, the attention output and its
    log-sum-exp (flash-attention saves them), the MLP."""
    d = v.hidden_size
    return 2 * _norm_saved(v, d, b) + 6 * b * d + 4 * v.num_heads + _mlp_saved(v, b)


def _stream_bytes(v: VisionShape, b: int) -> int:
    """Per patch, alive from the patch embedding to the tower's backward: the pixels' bf16 copy (the conv's saved
    input) and the rotary cos/sin (fp32)."""
    pixels = v.in_channels * v.temporal_patch_size * v.patch_size**2 * b
    return pixels + (8 * _head_dim(v) if v.kind in ROTARY else 0)


def _mergers_saved(v: VisionShape, b: int) -> int:
    """The merger(s), per patch: a norm, then fc1 and its GELU on the merged tokens (merge² patches wide); Qwen3-VL's
    DeepStack mergers do the same on intermediate blocks. SigLIP's projector pools first: its norm only."""
    d = v.hidden_size
    if v.kind == "siglip":
        return _norm_saved(v, d, b)
    return (1 + v.deepstack_layers) * (_norm_saved(v, d, b) + 2 * b * d)


def vision_saved_bytes(m: ModelShape, patches: int, b: int, checkpointing: bool) -> int:
    """What autograd keeps of the tower until its own backward, the decoder's forward and backward run meanwhile:
    with checkpointing (transformers applies it to the vision blocks too) each block's input and the final output,
    else every block's saved tensors; the mergers', the pixels' copy and cos/sin either way."""
    if m.vision is None or not patches:
        return 0
    v, d = m.vision, m.vision.hidden_size
    blocks = (v.depth + 1) * b * d if checkpointing else v.depth * block_saved_bytes(v, b) + b * d
    return patches * (blocks + _mergers_saved(v, b) + _stream_bytes(v, b))


def vision_forward_bytes(m: ModelShape, patches: int, b: int) -> int:
    """One block's working set without grad, per patch: its input, the norm's output (fp32 for a LayerNorm under
    autocast), qkv and the rotary's fp32 q, k and temporaries (24 bytes a channel); Qwen3-VL also holds its
    interpolated position embeddings (fp32) and the DeepStack features made so far. A wide MLP can be larger."""
    if m.vision is None or not patches:
        return 0
    v, d = m.vision, m.vision.hidden_size
    norm_out = b * d if v.kind in RMS_NORMS else 4 * d
    attention = 3 * b * d + (24 * d if v.kind in ROTARY else 3 * b * d)
    mlp = _mlp_saved(v, b) + b * d
    held = 0
    if v.kind == "qwen3_vl":
        held = 4 * d + v.deepstack_layers * b * v.out_hidden_size // v.spatial_merge_size**2
    return patches * (_stream_bytes(v, b) + b * d + norm_out + max(attention, mlp) + held)


def vision_backward_bytes(m: ModelShape, patches: int, b: int, checkpointing: bool) -> int:
    """The tower's own backward, after the decoder's: its saved tensors, one block recomputed (with checkpointing)
    and the gradients of that block's input and output."""
    if m.vision is None or not patches:
        return 0
    v = m.vision
    recomputed = block_saved_bytes(v, b) if checkpointing else 0
    return vision_saved_bytes(m, patches, b, checkpointing) + patches * (recomputed + 2 * b * v.hidden_size)


def image_embeds_bytes(m: ModelShape, rows: int, image_tokens_per_sample: int, tokens: int, b: int) -> int:
    """What the model's forward holds of the tower while the decoder runs: each merger's output and its
    concatenation (Qwen3-VL's DeepStack features too), the tower's last hidden state (in its output record), and
    Qwen3-VL's copy of the hidden states in the layers that add the DeepStack features."""
    if m.vision is None:
        return 0
    v, images = m.vision, rows * image_tokens_per_sample
    merged = 2 * (1 + v.deepstack_layers) * images * v.out_hidden_size * b
    last = images * v.spatial_merge_size**2 * v.hidden_size * b
    return merged + last + (tokens * m.hidden_size * b if v.deepstack_layers else 0)
