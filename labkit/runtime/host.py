"""The machine a worker group runs on, as the rollout engine's plan needs it: device kind, memory, usable CPUs.

Read from /proc/meminfo, the process's CPU affinity and torch.cuda (no psutil); the arithmetic on these facts is
``labkit.plan.rollout_engine``."""

from __future__ import annotations

import os

from labkit.plan.rollout_engine import Host


def memory_total_bytes() -> int:
    """MemTotal of /proc/meminfo in bytes (0 where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def this_host(ranks: int) -> Host:
    """This machine for ``ranks`` rank processes: one GPU's memory where CUDA is visible, else the RAM they share
    (torch is only imported where an NVIDIA driver is present: ``labkit plan`` stays import-light)."""
    cpus = (
        tuple(sorted(os.sched_getaffinity(0)))
        if hasattr(os, "sched_getaffinity")
        else tuple(range(os.cpu_count() or 1))
    )
    if os.path.exists("/proc/driver/nvidia"):
        import torch

        if torch.cuda.is_available():
            return Host("cuda", int(torch.cuda.get_device_properties(0).total_memory), cpus, ranks)
    return Host("cpu", memory_total_bytes(), cpus, ranks)
