"""What a real GPU lacks that a formula (or a fake trace) of allocated bytes does not see: the capacity as the GPU
reports it, the CUDA context, cuBLAS workspaces, NCCL buffers and the caching allocator's reserve, each a named term
with its source in ``data/gpus.json`` (``headroom``), and the fits / tight / OOM verdict of one phase.

An "80 GB" H100 reports 81,559 MiB (79.6 GiB) in nvidia-smi and ``torch.cuda.mem_get_info``; rollout's
``gpu_memory_utilization`` is a share of that total too. ``gpu_settings`` is the one place the CLI and the dashboard
turn a GPU choice into capacity and headroom.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from labkit.memory.data_tables import data_table
from labkit.memory.gpus import gpu
from labkit.rules.geometry import BatchGeometry

MiB, GiB = 2**20, 2**30
DEFAULT_GPU = "H100-80GB"
NON_ALLOCATOR = ("cuda_context", "nccl_buffers", "allocator_reserve")
"""Terms outside ``torch.cuda.memory_allocated`` (the cuBLAS workspace is inside it, but no fake trace sees it)."""
ENGINE = ("rollout_weights", "rollout_activations", "kv_cache")


@cache
def facts() -> dict[str, Any]:
    """``data/gpus.json``'s ``headroom`` section: each value with its ``*_source``."""
    return dict(data_table("gpus.json", "headroom"))


def reported_bytes(name: str) -> tuple[int, str]:
    """The capacity of GPU ``name`` as nvidia-smi reports it (MiB total), else its nominal bytes; and which."""
    g = gpu(name)
    mib = data_table("gpus.json", "gpus")[g.name].get("nvidia_smi_total_mib")
    if mib:
        return int(mib) * MiB, f"{g.name}: {mib:,} MiB as nvidia-smi reports it"
    return g.memory_bytes, f"{g.name}: nominal {g.memory_label} (no nvidia-smi total on record)"


def gpu_settings(
    geo: BatchGeometry, name: str | None, capacity: int | None = None, margin_gib: float | None = None
) -> dict:
    """``MemorySettings`` fields for a GPU: C (``capacity`` when the user gave one, else GPU ``name``'s reported
    total), the context, cuBLAS, NCCL and reserve terms, the margin; the NCCL buffers count the run's communicators
    (its geometry: the world, the actor's SP group, the rollout's TP group). KeyError for an unknown GPU."""
    f = facts()
    name = name or DEFAULT_GPU
    gpu(name)  # KeyError lists the known GPUs
    c, basis = (capacity, "as given") if capacity is not None else reported_bytes(name)
    basis = basis if capacity is not None else ("as reported" if "nvidia-smi" in basis else "nominal")
    comms = (1 if geo.world_size > 1 else 0) + (1 if geo.ulysses_sp > 1 else 0) + (1 if geo.rollout_tp > 1 else 0)
    sm90 = gpu(name).name in f["sm90_gpus"]
    return dict(
        gpu_bytes=int(c),
        capacity_basis=basis,
        cuda_context_bytes=int(f["cuda_context_mib"] * MiB),
        cublas_workspace_bytes=int(f["cublas_workspace_mib_sm90" if sm90 else "cublas_workspace_mib_other"] * MiB),
        nccl_bytes=int(comms * 2 * f["nccl_buffsize_mib"] * f["nccl_channels"] * MiB),
        reserve_fraction=float(f["allocator_reserve_fraction"]),
        margin_bytes=int((f["margin_gib"] if margin_gib is None else margin_gib) * GiB),
    )


def add_headroom(s: Any, instants: dict[str, dict[str, int]]) -> None:
    """Add the headroom terms to every instant, in place: context, cuBLAS and NCCL constants, and the allocator's
    reserve as a fraction of the instant's allocated training bytes. In ``generate`` the engine's share u·C already
    holds the process's own overhead (vLLM subtracts non-torch memory from its budget), so the KV pool shrinks by it."""
    fixed = {
        "cuda_context": s.cuda_context_bytes,
        "cublas_workspace": s.cublas_workspace_bytes,
        "nccl_buffers": s.nccl_bytes,
    }
    for terms in instants.values():
        trained = sum(v for k, v in terms.items() if k not in ENGINE and k != "rollout_share")
        if "kv_cache" in terms:
            terms["kv_cache"] = max(0, terms["kv_cache"] - sum(fixed.values()))
        terms.update(fixed)
        terms["allocator_reserve"] = int(s.reserve_fraction * trained)


def state(s: Any, peak_bytes: int, engine_error: object = None) -> tuple[str, int]:
    """``("fits" | "tight" | "OOM", bytes left of C)``: tight when fewer than ``margin_bytes`` are left."""
    left = s.gpu_bytes - peak_bytes
    if left < 0 or engine_error:
        return "OOM", left
    return ("tight" if left < s.margin_bytes else "fits"), left
