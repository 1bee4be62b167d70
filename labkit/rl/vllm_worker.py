"""vLLM's CPU worker with its shared-memory segments named after the labkit group that runs it.

vLLM names a TP group's CPU shared-memory segments after the worker's ``distributed_init_method``; in
external-launcher mode that is always ``env://``, so every engine on a machine would use the same names (two groups
at once would share segments). labkit passes this class as ``worker_cls`` with an init method whose basename is the
group's own identifier (torch.distributed is already up in the rank, so the method is not used to connect). Its
start also drops one C++ warning every rank prints on every start (NUMA binding: a single node here).
Imported by vLLM inside a rank (``LLM(worker_cls="labkit.rl.vllm_worker.LabkitCPUWorker")``), never by labkit itself.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vllm.v1.worker.cpu_worker import CPUWorker

IDENT_ENV = "LABKIT_VLLM_IDENT"
QUIET = ("Warning: NUMA binding: Using MEMBIND policy",)  # c10 prints it on every start; it reads no log level now


@contextmanager
def stderr_without(lines: tuple[str, ...]) -> Iterator[None]:
    """The process's stderr (file descriptor 2: C++ writes too) with the lines containing ``lines`` dropped."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [x for x in tmp.read().decode(errors="replace").splitlines(True) if not any(q in x for q in lines)]
            if kept:
                sys.stderr.write("".join(kept))


class LabkitCPUWorker(CPUWorker):
    """``vllm.v1.worker.cpu_worker.CPUWorker`` whose segments are /dev/shm/<LABKIT_VLLM_IDENT>-<group>-cpushm_<i>."""

    def __init__(
        self, vllm_config: Any, local_rank: int, rank: int, distributed_init_method: str, is_driver_worker: bool = False
    ) -> None:
        ident = os.environ.get(IDENT_ENV)
        if ident:
            distributed_init_method = f"file:///labkit/{ident}"
        with stderr_without(QUIET):
            super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker=is_driver_worker)
