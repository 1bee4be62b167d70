"""Who holds the GPU when PyTorch's allocator fails: this process's live tensors (a peak), its cached but unusable
blocks (fragmentation), or another process (a shared GPU). Read from PyTorch's own message
(c10/cuda/CUDACachingAllocator.cpp: the OOM text lists every process NVML reports on the device as "Process P has X
memory in use", this one as "Including non-PyTorch memory, this process has X memory in use", then "Of the allocated
memory A is allocated by PyTorch, and R is reserved by PyTorch but unallocated").

In a container PyTorch cannot match its own pid to NVML's, so it lists itself as "Process P" too; then the entry
nearest this process's own reserve (A + R) is taken as this process, and only the rest count as other holders."""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.diagnose.log_failures import AllocationFailure

GiB = 2**30
FRAGMENTED = 0.10
"""Reserved-but-unallocated above this share of the capacity is called fragmentation even when smaller than the
request (PyTorch's own hint starts "If reserved but unallocated memory is large")."""
SHARED = 0.10
"""Other processes holding more than this share of the capacity make the GPU shared: without them the allocation
would have had that much more room."""


@dataclass
class Holders:
    """This process's share (NVML's figure, when PyTorch printed one for it) and the other processes' shares."""

    this: int | None
    others: list[tuple[int, int]] = field(default_factory=list)
    self_inferred: bool = False
    """This process was one of the "Process P" entries (a container), picked by its size."""

    @property
    def others_bytes(self) -> int:
        return sum(b for _, b in self.others)


def holders(a: AllocationFailure) -> Holders:
    """Split PyTorch's list of processes into this one and the others."""
    if a.process is not None or not a.listed:
        return Holders(a.process, list(a.listed))
    own = (a.allocated or 0) + (a.reserved_unallocated or 0)
    pid, size = min(a.listed, key=lambda pb: abs(pb[1] - own))
    return Holders(size, [pb for pb in a.listed if pb[0] != pid], self_inferred=True)


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:,.2f} GiB"


def verdict(a: AllocationFailure) -> tuple[str | None, list[str]]:
    """``shared`` | ``fragmentation`` | ``peak`` (None without PyTorch's figures) and the lines that say why, the
    deciding one first."""
    if a.requested is None or a.reserved_unallocated is None:
        return None, []
    cap, spare, h = a.capacity or 0, a.reserved_unallocated, holders(a)
    lines = []
    kind = "peak"
    others = h.others_bytes
    if others and (others > SHARED * cap or others + (a.free or 0) >= a.requested > (a.free or 0)):
        kind = "shared"
        who = ", ".join(f"process {p} {_gib(b)}" for p, b in h.others)
        mine = f"this process holds {_gib(h.this)}" if h.this is not None else "this process's share is not printed"
        lines.append(
            f"shared GPU: other processes hold {_gib(others)} of GPU {a.gpu}'s {_gib(cap)} ({who}); {mine}, of which "
            f"PyTorch has {_gib(a.allocated)} allocated. Without them the {_gib(a.requested)} request would have fit. "
            "Free the GPU: a rollout engine or trainer left over from an earlier run, another job on the node, or a "
            "second worker placed on this GPU (a colocated reward model or critic, SGLang's scheduler child, a vLLM "
            "server) whose share is not in the plan; `nvidia-smi` names the pid. Lowering this process's peak only "
            "helps by as much as the others hold."
        )
        if h.self_inferred:
            lines.append(
                "  (PyTorch listed this process by pid too, as inside a container: the entry nearest its own "
                f"reserve, {_gib((a.allocated or 0) + spare)}, was taken as this process)"
            )
    if spare >= a.requested or (cap and spare > FRAGMENTED * cap):
        if kind == "peak":
            kind = "fragmentation"
        lines.append(
            f"fragmentation: PyTorch holds {_gib(spare)} reserved but unallocated"
            + (f", more than the {_gib(a.requested)} it asked for" if spare >= a.requested else "")
            + ", yet no free block was large enough. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the "
            "allocator then grows segments instead of cutting new ones); it does not lower the peak itself."
        )
    if h.self_inferred and kind != "shared":
        pid = next(p for p, b in a.listed if b == h.this)
        lines.append(
            f"PyTorch lists this process by pid (Process {pid}, {_gib(h.this)}), as inside a container: it is this "
            "process, not another holder"
        )
    if kind == "peak":
        lines.append(
            f"a peak of this process: no other process holds a share that matters and only {_gib(spare)} is reserved "
            "but unallocated; the memory is held by this process's live tensors, so the peak itself must come down."
        )
    return kind, lines
