"""The VL trace's inputs (``labkit.model.trace_vision``): the image grid, and the boolean image masks that become
index tensors of the known image-token count under fake tensors."""

import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from labkit.model.trace_vision import ImageIndexing, image_grid


@pytest.mark.parametrize("tokens", [1, 7, 256, 1000, 1024, 3600, 4093])
def test_the_grid_holds_the_image_tokens_as_square_as_they_allow(tokens):
    t, h, w = image_grid(tokens, 2)
    assert t == 1 and h % 2 == 0 and w % 2 == 0
    assert (h // 2) * (w // 2) == tokens  # each decoder token is merge² patches
    assert h <= w and all(tokens % k for k in range(h // 2 + 1, int(tokens**0.5) + 1))


def test_a_boolean_image_mask_becomes_the_image_positions_and_the_check_is_restored():
    os.environ.pop(ImageIndexing.CHECK, None)
    real_grid = torch.tensor([[1, 4, 6]])
    with FakeTensorMode():
        hidden = torch.empty(1, 64, 8, dtype=torch.bfloat16)
        mask = torch.empty(1, 64, dtype=torch.bool)
        features = torch.empty(24, 8, dtype=torch.bfloat16)
        with ImageIndexing(tokens=64, image_tokens=24):
            assert os.environ[ImageIndexing.CHECK] == "1"
            picked = hidden[mask, :]
            hidden[mask, :] = picked + features  # Qwen3-VL's DeepStack add
            other = hidden[:, :10]  # any other index is left as written
            grid = real_grid.prod(-1)  # a real tensor's arithmetic runs for real
        assert isinstance(picked, FakeTensor) and picked.shape == (24, 8)
        assert other.shape == (1, 10, 8)
        assert not isinstance(grid, FakeTensor) and grid.tolist() == [24]
    assert ImageIndexing.CHECK not in os.environ


def test_a_vl_trace_refuses_what_it_cannot_build():
    from labkit.memory.model_catalogue import model_shape
    from labkit.model.memory_trace import trace_pass

    shape = model_shape("Qwen2.5-VL-7B-Instruct")
    for options in ({"sp": 2, "image_tokens": 64}, {"image_tokens": 0}, {"image_tokens": 300}):
        with pytest.raises(ValueError, match="VL model is traced packed"):
            trace_pass(shape, [256, 256], device="cpu", **options)
