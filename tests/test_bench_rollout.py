"""Smoke test of benchmarks/bench_rollout.py at a small size: one run starts a vLLM and an HF group (1 rank each, the
cheapest), every row generates the requested tokens on both, nothing is left, and the vLLM/HF ratios are printed."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.rl import engines

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench_rollout.py"


@pytest.mark.slow
@pytest.mark.skipif(not engines.vllm_available(), reason="vLLM is not installed here")
def test_vllm_and_hf_on_the_same_workload_print_their_ratios(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    args = ["--world", "1", "--tp", "1", "--prompts", "2", "--n", "2", "--tokens", "8", "--repeats", "1"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args, "--json", str(tmp_path / "b.json")],
        capture_output=True, text=True, timeout=400, env=env, cwd=str(ROOT),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(
        r"^\s*(vllm|hf) W=1 TP=1: cold start ([\d.]+) s .*?4 rows × 8 tokens .*?left \[\]", proc.stdout, re.M
    )
    assert [r[0] for r in rows] == ["vllm", "hf"], proc.stdout
    ratio = re.search(r"TP=1: vLLM/HF cold start ([\d.]+)x, tokens/s ([\d.]+)x", proc.stdout)
    assert ratio and float(ratio.group(1)) > 0 and float(ratio.group(2)) > 0, proc.stdout
    import json

    runs = json.loads((tmp_path / "b.json").read_text())["runs"]
    assert [r["new_tokens"] for r in runs] == [32, 32]  # EOS ignored: 4 rows × 8 tokens on both engines
