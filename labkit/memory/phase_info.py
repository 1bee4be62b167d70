"""What a phase states about the model beside its bytes (``Phase.info``): a MoE's total and active parameters, the
layer kinds whose training activations are not modelled, and a VL model's image-token assumption."""

from __future__ import annotations

from functools import cache

from labkit.memory.shapes import ModelShape
from labkit.memory.vision import vision_patches


@cache
def model_info(m: ModelShape) -> dict[str, object]:
    """MoE: ``total_params`` (every expert is held, sharded and gathered) and ``active_params`` (what one token runs
    through); MLA, sliding-window or linear-attention layers: ``not_modelled``, what the training passes leave out."""
    out: dict[str, object] = {}
    if m.is_moe:
        out = {"total_params": m.param_count(), "active_params": m.active_param_count()}
    kinds = {m.layer_type(i) for i in range(m.num_hidden_layers)} - {"full_attention"}
    if m.block_pattern:
        out["not_modelled"] = (
            "each block (a Mamba2 mixer, attention or the MoE alone) is priced as a full decoder layer: attention of "
            "the config's widths and the MoE (an over-estimate; the Mamba2 kernels' tensors are not modelled or traced)"
        )
    elif m.mla is not None or kinds:  # the KV cache is per kind (generate); the training passes are not
        mixers = ", ".join(sorted(kinds | ({"MLA"} if m.mla is not None else set())))
        streams = " with one residual stream (not its four hyper-connection streams)" if m.compressed_attention else ""
        out["not_modelled"] = (
            f"the training passes price the {mixers} layers' activations as full attention of the config's widths"
            f"{streams} (their own kernels' tensors are not modelled or traced)"
        )
    return out


def vision_info(m: ModelShape, rows: int, image_tokens_per_sample: int) -> dict[str, object]:
    """A VL model's assumption, stated: image tokens per sample, the patches its tower sees, its parameters."""
    if m.vision is None:
        return {}
    patches = vision_patches(m, rows, image_tokens_per_sample)
    return {
        "image_tokens_per_sample": image_tokens_per_sample,
        "vision_patches": patches,
        "vision_params": m.vision_param_count(),
        "vision_assumption": f"assumes {image_tokens_per_sample:,} image tokens per sample ({patches:,} patches for "
        f"{rows} row{'s' if rows != 1 else ''}); --image-tokens N changes it",
    }
