"""Run a fake-CUDA memory trace (``labkit.model.memory_trace``) in a fresh Python process: on a CPU-only torch the
fake CUDA hooks must be loaded before torch is imported, which the calling process (a test, a notebook, the CLI)
may have done already. The child starts importing torch and transformers at once and reads its specs from stdin, so
a caller can start it ahead of the work that decides what to trace. Imports no torch itself."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, is_dataclass
from typing import Any


class TraceProcess:
    """One trace child (``labkit.model.trace_main``), started on construction; ``run`` sends it the specs and waits.
    A context manager: leaving it kills a child that is still running (the caller failed before tracing)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "labkit.model.trace_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, specs: list[dict[str, Any]], timeout: float = 600) -> list[dict[str, Any]]:
        """Trace each spec (``model``: a shape name or a ``ModelShape``; ``seq_lengths`` and ``trace_pass``'s
        options); RuntimeError with the child's last line, or when it runs past ``timeout`` seconds."""
        specs = [{**s, "model": asdict(s["model"]) if is_dataclass(s["model"]) else s["model"]} for s in specs]
        try:
            out, err = self.proc.communicate(json.dumps(specs), timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise RuntimeError(f"memory trace took longer than {timeout:.0f} s") from None
        if self.proc.returncode != 0:
            raise RuntimeError(f"memory trace failed: {err.strip().splitlines()[-1:]}")
        return json.loads(out.strip().splitlines()[-1])

    def run_one(self, model: Any, seq_lengths: list[int], timeout: float = 300, **options: Any) -> dict[str, Any]:
        """``run`` of one spec; returns its ``TraceResult`` as a dict."""
        return self.run([{"model": model, "seq_lengths": list(seq_lengths), **options}], timeout)[0]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()

    def __enter__(self) -> TraceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_traces(specs: list[dict[str, Any]], timeout: float = 600) -> list[dict[str, Any]]:
    """Several traces in one fresh process (torch and transformers import once)."""
    with TraceProcess() as child:
        return child.run(specs, timeout)


def run_trace(model: Any, seq_lengths: list[int], timeout: float = 300, **options: Any) -> dict[str, Any]:
    """``memory_trace.trace_pass`` of ``model`` (a shape name or a ``ModelShape``) on one micro-batch of
    ``seq_lengths``; options: update, entropy, checkpointing, temperature, head (flash_attn | torch), device (cuda |
    cpu), fused, sp, padded... Returns the ``TraceResult`` as a dict."""
    with TraceProcess() as child:
        return child.run_one(model, seq_lengths, timeout, **options)
