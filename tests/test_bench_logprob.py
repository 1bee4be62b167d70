"""Smoke test of benchmarks/bench_logprob.py: its CPU part at a tiny size prints the throughput ratios, padded and
packed log-probs agree, the log-prob head's measured peak memory is the predicted one, the GPU part says it is
skipped without CUDA, and the GPU code path runs on CPU (tiny config).
The script must not import ray or tensordict (the GPU image has neither)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench_logprob.py"


def _run(*args: str) -> str:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120, env=env, cwd=str(ROOT)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_cpu_part_ratios_gpu_skip_and_gpu_code_path():
    out = _run(
        "--cpu-rows",
        "16",
        "--cpu-reps",
        "1",
        "--head-tokens",
        "256",
        "--head-chunk",
        "64",
        "--gpu-dry-run-cpu",
        "--gpu-seqs",
        "8",
        "--gpu-token-budget",
        "256",
        "--pad-multiple",
        "64",
        "--chunk-size",
        "64",
    )
    cpu, gpu = out.split("GPU part skipped: no CUDA device")  # the skip line is printed exactly once
    # the log-prob head at the 0.5B vocabulary: measured peak (VmHWM) = predicted bytes; chunked = naive's numbers
    peaks = re.findall(r"(naive|chunked)\s.*peak\s+([\d.]+) MiB \(([\d.]+) x predicted\)", cpu)
    assert [p[0] for p in peaks] == ["naive", "chunked"], out
    assert all(0.9 < float(p[2]) < 1.1 for p in peaks), out  # naive 256 x V x 8 B, chunked 64 x V x 8 B
    assert float(peaks[1][1]) < float(peaks[0][1]) / 2, out
    assert float(re.search(r"max \|chunked - naive\| log p: (\S+)", cpu).group(1)) < 1e-5, out
    for label in ("B packed static / A padded", "C packed dynamic / A padded", "D chunked / C naive"):
        assert re.search(rf"ratio {re.escape(label)}: \d+\.\d\dx", cpu), out
    diff = float(re.search(r"max \|log p - padded log p\| over response tokens, all variants: (\S+)", cpu).group(1))
    assert diff < 1e-4, out  # fp32: packed, dynamic and chunked give the padded path's log-probs
    fed = [int(m.replace(",", "")) for m in re.findall(r"fed tokens\s+([\d,]+)", cpu)]
    assert fed[0] == 16 * 128 and fed[0] > fed[1] == fed[2] == fed[3], out  # padded: full width, not the micro max
    # the GPU code path (packing, pad to a multiple, hidden-state chunked log-prob) on CPU with a tiny config
    assert "GPU part: CPU dry run" in gpu and len(re.findall(r"real tok/s", gpu)) == 5, out
    assert re.search(r"ratio D chunked / C naive \(speed\): \d+\.\d\dx", gpu), out
    assert "GPU part done" in gpu and "imported ray/tensordict: none" in gpu, out
