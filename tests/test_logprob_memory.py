"""labkit.model.logprob_memory: the predicted bytes against the H200 anchor and a CPU measurement, and the meter itself."""

import json
import subprocess
import sys

import pytest
import torch

from labkit.memory.logprob import logprob_peak_bytes
from labkit.model.logprob_memory import PeakMeter

QWEN2_05B_PARAMS, QWEN2_05B_VOCAB = 494_032_768, 151_936
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the CPU meter reads /proc (Linux only)")


def test_predicted_bytes_match_the_h200_anchor():
    """H200 measurement: padded static micro-batch, 8 rows x 4,096 tokens, bf16 Qwen2-0.5B, naive fp32 log-softmax:
    47.3 GiB peak measured, weights included."""
    peak = QWEN2_05B_PARAMS * 2 + logprob_peak_bytes(8 * 4096, QWEN2_05B_VOCAB, 2)
    assert round(peak / 2**30, 1) == 47.3
    assert logprob_peak_bytes(100, 10, 4) == 100 * 10 * 8  # fp32 logits: no upcast copy
    assert logprob_peak_bytes(100, 10, 2, chunk=30) == 30 * 10 * 10
    assert logprob_peak_bytes(10, 10, 2, chunk=30) == 10 * 10 * 10  # a chunk larger than the tokens
    for bad in [dict(tokens=-1), dict(chunk=0)]:
        with pytest.raises(ValueError, match="must be >= 0 and chunk > 0"):
            logprob_peak_bytes(**{"tokens": 8, "vocab": 4, "dtype_bytes": 2, **bad})


@linux_only
def test_peak_meter_sees_a_freed_allocation():
    mib = 2**20
    with PeakMeter("cpu") as meter:
        x = torch.ones(96 * mib // 4)  # 96 MiB, written, so resident
        del x
    assert meter.bytes is not None and 0.95 * 96 * mib < meter.bytes < 1.1 * 96 * mib, meter.bytes
    with PeakMeter("cpu") as idle:
        pass
    assert idle.bytes is not None and idle.bytes < 4 * mib


@linux_only
def test_head_measured_equals_predicted_and_chunked_is_a_quarter():
    """fp32 on CPU: naive holds logits + log-softmax for all tokens (8 B per logit), chunked for one chunk. A chunk
    is 64 x V x 4 B = 37 MiB, above glibc's largest mmap threshold (32 MiB), so RSS sees each allocation."""
    # in a fresh process: a long-lived test worker's heap can hand back freed pages already resident, which the RSS
    # meter cannot see (measured once at half the chunked peak after a thousand other tests)
    code = (
        "import json, torch; from labkit.model.logprob_memory import measure_logprob_head as m; "
        f"r = m(256, 64, {QWEN2_05B_VOCAB}, 64); "
        "print(json.dumps({k: [v.peak_bytes, v.predicted_bytes] for k, v in r.items()} | "
        "{'equal': bool(torch.equal(r['chunked'].log_probs, r['naive'].log_probs))}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("naive", "chunked"):
        peak, predicted = runs[name]
        assert 0.9 < peak / predicted < 1.1, (name, peak, predicted)
    assert runs["chunked"][0] < runs["naive"][0] / 3
    assert runs["equal"]  # fp32 rows are independent: bit-equal
