"""The images of a VL model's traced pass (``labkit.model.memory_trace``): what verl feeds Qwen2-VL / Qwen2.5-VL /
Qwen3-VL besides the packed tokens (``pixel_values`` and ``image_grid_thw`` of each sample's image), and the few
places where transformers' forward reads values a fake tensor does not have.

Each sequence holds one image of ``image_tokens`` decoder tokens (``spatial_merge_size²`` patches each). The grid's
derived index tensors (rotary positions, cumulative lengths, Qwen2.5-VL's windows, Qwen3-VL's position-table
interpolation) are computed by transformers' own ``vision_utils`` helpers on the real grid and handed to the forward
as its documented precomputed ``image_*`` arguments; ``ImageIndexing`` runs the remaining integer arithmetic on the
real grid (the per-image split sizes) and stands in for the boolean image masks (``hidden[mask]``, Qwen3-VL's
DeepStack) with index tensors of the known image-token count, as a GPU's ``nonzero`` would make them.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.overrides import TorchFunctionMode

VISION_ATTENTION = "labkit_flash_vision"
"""The vision tower's attention implementation: a name with "flash" in it makes transformers take its varlen path
(one kernel over every image, ``cu_seqlens``), as verl's flash_attention_2 runs it."""


def image_grid(image_tokens: int, merge: int) -> tuple[int, int, int]:
    """One image's (t, h, w) patch grid of ``image_tokens`` decoder tokens: as square as the count allows."""
    across = max(d for d in range(1, int(image_tokens**0.5) + 1) if image_tokens % d == 0)
    return 1, merge * across, merge * (image_tokens // across)


def image_inputs(model: Any, images: int, image_tokens: int, device: str) -> dict[str, Any]:
    """``pixel_values`` (fp32, as verl's processor makes them), the real ``image_grid_thw`` and the precomputed
    ``image_*`` index tensors (on ``device``, fake) for ``images`` images of ``image_tokens`` tokens."""
    from transformers import vision_utils as vu

    visual = model.model.visual
    vc, merge = visual.config, visual.spatial_merge_size
    with unset_fake_temporarily():  # the grid and its index tensors are real (CPU) values
        grid = torch.tensor([image_grid(image_tokens, merge)] * images)
        real: dict[str, Any] = {"position_ids": vu.get_vision_position_ids(grid, merge)}
        real["cu_seqlens"] = cu = vu.get_vision_cu_seqlens(grid)
        longest = {"max_seqlen": int((cu[1:] - cu[:-1]).max())}
        if hasattr(visual, "fullatt_block_indexes"):  # Qwen2.5-VL's window attention
            window, cu_window = vu.get_vision_window_index(grid, merge, visual.window_size, visual.patch_size)
            real.update(window_index=window, cu_window_seqlens=cu_window)
            longest["max_window_seqlen"] = int((cu_window[1:] - cu_window[:-1]).max())
        if hasattr(visual, "num_grid_per_side"):  # Qwen3-VL's learned position table
            real["interp_indices"], real["interp_weights"] = vu.get_vision_interpolation_indices_and_weights(
                grid,
                visual.num_grid_per_side,
                mode=visual.interpolation_mode,
                align_corners=visual.interpolation_align_corners,
                spatial_merge_size=merge,
            )
        patches = int(grid.prod(-1).sum())
    pixel_width = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    out: dict[str, Any] = {
        "pixel_values": torch.empty(patches, pixel_width, dtype=torch.float32, device=device),
        "image_grid_thw": grid,
    }
    out.update({f"image_{k}": torch.empty(v.shape, dtype=v.dtype, device=device) for k, v in real.items()})
    out.update({f"image_{k}": v for k, v in longest.items()})
    return out


class ImageIndexing(TorchFunctionMode):
    """During a VL pass: a call whose tensors are all real (the grid's arithmetic) runs for real; a boolean mask over
    the ``tokens`` positions used as an index becomes index tensors of its ``image_tokens`` true positions; and
    transformers' check that the image tokens match the image features is off (``TRANSFORMERS_DISABLE_TORCH_CHECK``:
    the fake token ids have no values to count; the trace builds them to match)."""

    CHECK = "TRANSFORMERS_DISABLE_TORCH_CHECK"

    def __init__(self, tokens: int, image_tokens: int) -> None:
        super().__init__()
        self.tokens, self.image_tokens = tokens, image_tokens
        self.saved: str | None = None

    def __enter__(self) -> ImageIndexing:
        self.saved = os.environ.get(self.CHECK)
        os.environ[self.CHECK] = "1"
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.saved is None:
            os.environ.pop(self.CHECK, None)
        else:
            os.environ[self.CHECK] = self.saved
        super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if tensors and not any(isinstance(a, FakeTensor) for a in tensors):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[1], tuple):
            args = (args[0], tuple(j for i in args[1] for j in self._positions(i)), *args[2:])
        return func(*args, **kwargs)

    def _positions(self, index: Any) -> tuple[Any, ...]:
        if isinstance(index, torch.Tensor) and index.dtype == torch.bool and index.numel() == self.tokens:
            return tuple(
                torch.empty(self.image_tokens, dtype=torch.long, device=index.device) for _ in range(index.dim())
            )
        return (index,)
