"""The vision tower of a VL model in the actor's passes (Qwen2-VL / Qwen2.5-VL / Qwen3-VL, Gemma 3's SigLIP).

Its parameters are in ``ModelShape.param_count`` (FSDP shards them like the rest; each vision block is an FSDP unit
of its own, smaller than a decoder layer, so the gathered copies are the decoder's). Its activations depend on how
many image tokens each sample has, which sequence lengths cannot say: ``MemorySettings.image_tokens_per_sample`` is
that assumption, stated in the phase's ``info``. Each image token of the decoder is ``spatial_merge_size²``
patches of the tower (Qwen's merger; SigLIP pools, 1). The tower runs before the decoder (verl's forward passes
``pixel_values``): without grad one block's working set at a time; under grad every block's saved tensors (its
input only with gradient checkpointing, which transformers applies to the vision blocks too).
"""

from __future__ import annotations

from labkit.memory.shapes import ModelShape


def vision_patches(m: ModelShape, rows: int, image_tokens_per_sample: int) -> int:
    """Patches the tower sees for a micro-batch of ``rows`` samples (0 for a text-only model)."""
    if m.vision is None:
        return 0
    return rows * image_tokens_per_sample * m.vision.spatial_merge_size**2


def vision_forward_bytes(m: ModelShape, patches: int, b: int) -> int:
    """One vision block's working set without grad: the residual and its norm, then qkv + attention output or the
    MLP (gated on Qwen2.5-VL: gate, up and product; else fc1 and its activation)."""
    if m.vision is None or not patches:
        return 0
    d, i = m.vision.hidden_size, m.vision.intermediate_size
    mlp = 3 * i if m.vision.kind == "qwen2_5_vl" else 2 * i
    return patches * b * (3 * d + max(4 * d, mlp))


def vision_saved_bytes(m: ModelShape, patches: int, b: int, checkpointing: bool) -> int:
    """What autograd keeps of the tower: each block's input with checkpointing (plus one block recomputed in its
    backward, ``vision_forward_bytes`` bounds it), else each block's norms, qkv, attention output and MLP tensors."""
    if m.vision is None or not patches:
        return 0
    v = m.vision
    if checkpointing:
        return v.depth * patches * v.hidden_size * b
    d, i = v.hidden_size, v.intermediate_size
    mlp = 4 * i if v.kind == "qwen2_5_vl" else 2 * i
    return v.depth * patches * b * (4 * d + 3 * d + d + mlp)
