"""The memory model against the tiny model's real passes on the CPU (allocator events, ``AllocationMeter``):
forward log-prob within ±10%, update within ±15%; HF generate holds at least the predicted KV cache; verl's own
entropy and log-prob functions allocate what the terms say. The live 4-rank check (bytes_measured vs
bytes_predicted per rank) runs in notebooks/07_oom_debugging.ipynb, which the suite executes."""

import torch

from labkit.memory.model_catalogue import model_shape
from labkit.memory.phases import hf_generate
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


def test_verl_entropy_and_log_prob_allocate_what_the_model_says():
    """verl 0.9.1's own entropy_from_logits (2·T·V·b without autocast), entropy_from_logits_with_chunking
    (c·V·(4·[b<4] + 8)) and logprobs_from_logits (no flash_attn on a CPU: the torch head, no T×V temporary under
    no_grad), measured by the allocator on the CPU against the model's terms."""
    from dataclasses import replace

    from verl.utils import torch_functional as verl_F

    from labkit.memory.phase_records import PassShape
    from labkit.memory.phases import forward_pass
    from labkit.model.memory_check import tiny_settings

    tokens, vocab, chunk = 1024, 4096, 256
    shape = replace(model_shape("tiny-qwen2"), vocab_size=vocab)
    for dtype, b in ((torch.float32, 4), (torch.bfloat16, 2)):
        logits = torch.randn(tokens, vocab).to(dtype)
        for chunked in (False, True):
            s = tiny_settings(shape, compute_bytes=b, entropy_chunking=chunked, entropy_chunk_size=chunk,
                              logprob_kernel="torch")  # fmt: skip
            phase = forward_pass(s, "old_log_prob", PassShape(1, tokens))
            with AllocationMeter() as m:
                if chunked:
                    verl_F.entropy_from_logits_with_chunking(logits, chunk_size=chunk)
                else:
                    verl_F.entropy_from_logits(logits)
            predicted = phase.instants["entropy"]["entropy"]
            assert abs(m.peak_bytes - predicted) <= 0.01 * predicted, (dtype, chunked, m.peak_bytes, predicted)
        with AllocationMeter() as m:
            verl_F.logprobs_from_logits(logits, torch.randint(0, vocab, (tokens,)))
        head = forward_pass(s, "ref_log_prob", PassShape(1, tokens)).instants["log_prob"]
        assert "log_softmax" not in head and m.peak_bytes < 0.01 * tokens * vocab * b
