"""Run a fake-CUDA memory trace (``labkit.model.memory_trace``) in a fresh Python process: on a CPU-only torch the
fake CUDA hooks must be loaded before torch is imported, which the calling process (a test, a notebook, the CLI)
may have done already. Imports no torch itself."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, is_dataclass
from typing import Any


def run_traces(specs: list[dict[str, Any]], timeout: float = 600) -> list[dict[str, Any]]:
    """Several traces in one fresh process (torch and transformers import once): each spec holds ``model`` (a shape
    name or a ``ModelShape``), ``seq_lengths`` and ``trace_pass``'s options. RuntimeError with the child's last line."""
    specs = [{**s, "model": asdict(s["model"]) if is_dataclass(s["model"]) else s["model"]} for s in specs]
    proc = subprocess.run(
        [sys.executable, "-m", "labkit.model.trace_main", json.dumps(specs)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory trace failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_trace(model: Any, seq_lengths: list[int], timeout: float = 300, **options: Any) -> dict[str, Any]:
    """``memory_trace.trace_pass`` of ``model`` (a shape name or a ``ModelShape``) on one packed micro-batch of
    ``seq_lengths``; options: update, entropy (none | eager | compiled), checkpointing, temperature, head
    (flash_attn | torch), device (cuda | cpu). Returns the ``TraceResult`` as a dict."""
    return run_traces([{"model": model, "seq_lengths": list(seq_lengths), **options}], timeout)[0]
