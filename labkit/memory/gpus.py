"""The GPUs labkit prices against, read from ``data/gpus.json``: each one's nominal memory (and dense BF16 peak where
published), looked up by name."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache

from labkit.memory.data_tables import data_table, lookup_entry


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's nominal memory (and dense BF16 peak where published)."""

    name: str
    """The key in ``data/gpus.json`` (e.g. ``H100-80GB``)."""
    vendor_name: str
    """The product as the vendor names it."""
    memory_label: str
    """The vendor's capacity string (``80GB HBM3``)."""
    memory_unit: str
    """How the label's GB reads: ``GiB`` (2**30 bytes) or ``GB`` (10**9)."""
    memory_bytes: int
    """Nominal capacity in bytes; the driver and CUDA context keep part of it."""
    bf16_tflops: float | None
    """Dense (no sparsity) BF16 tensor-core peak, or None when not published."""

    @property
    def memory_gib(self) -> float:
        """``memory_bytes`` in GiB."""
        return self.memory_bytes / 2**30


def gpu_names() -> list[str]:
    """The GPUs in ``data/gpus.json``, in file order."""
    return list(data_table("gpus.json", "gpus"))


@cache
def gpu(name: str) -> GpuSpec:
    """The GPU ``name`` (a key of ``data/gpus.json``, any case). KeyError lists the known names."""
    key, entry = lookup_entry(data_table("gpus.json", "gpus"), name, "GPU", aliases=False)
    return GpuSpec(name=key, **{f.name: entry[f.name] for f in fields(GpuSpec) if f.name != "name"})
