"""Smoke test of benchmarks/gpu_memory.py on the CPU with the tiny shape: the grid runs through FSDP2 on one rank,
every pass is printed with measured and predicted bytes, all within the GPU run's tolerances, and the JSON is
written as it goes. Without CUDA and without --cpu-tiny it says that nothing was measured."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "gpu_memory.py"


def _run(*args: str) -> str:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_cpu_tiny_grid(tmp_path):
    out_json = tmp_path / "memory.json"
    out = _run("--cpu-tiny", "--forward", "8x112", "--update", "8x56", "--json", str(out_json))
    lines = [line for line in out.splitlines() if " tokens " in line]
    assert len(lines) == 2 and all(line.rstrip().split("(peak")[0].strip().endswith("ok") for line in lines), out
    assert "2/2 passes within tolerance" in out
    doc = json.loads(out_json.read_text())
    assert [r["pass"] for r in doc["rows"]] == ["forward", "update"]
    assert all(r["measured_bytes"] > 0 and r["predicted_bytes"] > 0 for r in doc["rows"])
    assert "no CUDA device" in _run()
