"""The memory model against the tiny model's real passes on the CPU (allocator events, ``AllocationMeter``):
forward log-prob within ±10%, update within ±15%; HF generate holds at least the predicted KV cache."""

import torch

from labkit.memory.phases import hf_generate
from labkit.memory.shapes import model_shape
from labkit.model.allocation_meter import AllocationMeter
from labkit.model.memory_check import check_passes


def test_allocation_meter_is_exact():
    with AllocationMeter() as m:
        a = torch.ones(1000, 1000)  # 4 MB
        b = a * 2  # 8 MB live
        del a
        c = torch.ones(2000, 1000)  # 4 + 8 = 12 MB live
        del b, c
    assert (m.peak_bytes, m.final_bytes) == (12_000_000, 0)


def test_tiny_passes_predicted_vs_measured():
    got = check_passes("tiny-qwen2", rows=8, prompt=24, response=32)
    assert 0.9 <= got["old_log_prob"].ratio <= 1.1, got["old_log_prob"]
    assert 0.85 <= got["update_actor"].ratio <= 1.15, got["update_actor"]
    kv = hf_generate(model_shape("tiny-qwen2"), 8, 24, 8, 4).instants["decode"]["kv_cache"]
    assert got["generate"].measured_bytes >= kv
