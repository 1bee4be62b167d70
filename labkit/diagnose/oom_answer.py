"""The answer to an allocation failure: the log's figures, which tensor the request was (matched against the memory
model's tensors of the failing phase, or the T × V products it is consistent with), fragmentation, and, with a
recovered config, labkit's prediction for that phase beside the log and the fixes with their new peaks (who held the
GPU, this process or another, is ``labkit.diagnose.gpu_share``'s)."""

from __future__ import annotations

from typing import Any

from labkit.diagnose.log_failures import AllocationFailure
from labkit.diagnose.oom_match import GiB, Tensor, factorisations, match
from labkit.memory.verdict import MemoryReport


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:,.2f} GiB"


def figures(a: AllocationFailure) -> list[str]:
    """The failure as the log printed it."""
    if a.device == "cpu":
        return [f"host allocation failed: {a.requested:,} bytes ({_gib(a.requested)}) requested from the CPU allocator"]
    if a.device == "kv-cache":
        return ["the rollout engine found no memory for its KV-cache pool at start-up"]
    if a.device == "engine-start":
        return [
            f"vLLM's start-up check: {_gib(a.free)} free of {_gib(a.capacity)}, less than its share u·C = "
            f"{a.share} × {_gib(a.capacity)} = {_gib(a.requested)}; {_gib((a.capacity or 0) - (a.free or 0))} was "
            "already held (the training side not yet offloaded, another process): the generate phase's memory"
        ]
    if a.requested is None:
        return ["CUDA out of memory, without sizes (a CUDA error or vLLM's own allocator, not PyTorch's)"]
    return [
        f"GPU {a.gpu}: requested {_gib(a.requested)}; capacity {_gib(a.capacity)}, free {_gib(a.free)}; allocated "
        f"by PyTorch {_gib(a.allocated)}, reserved but unallocated {_gib(a.reserved_unallocated)}"
        + (f"; this process {_gib(a.process)} in use" if a.process is not None else "")
    ]


def pool_not_explained(rep: MemoryReport, a: AllocationFailure) -> str:
    """The line for an engine that found no KV room where labkit's model leaves it one: what labkit gives it, and
    what it does not model (SGLang sizes its pool after everything the GPU holds when it starts)."""
    g = rep.phases["generate"]
    gpu = f"{rep.settings.gpu_bytes / GiB:,.2f} GiB GPUs" + (
        " (assumed: the log names no capacity)" if a.capacity is None else ""
    )
    return (
        f"labkit's model leaves the engine a KV pool of {_gib(g.instants['engine'].get('kv_cache', 0))} on {gpu}, so "
        "it does not "
        "explain this failure: SGLang sizes its pool as u·C minus everything on the GPU when it starts (the training "
        "side not yet offloaded, another process), which labkit does not subtract; or the lengths or the GPU differ"
    )


FP32_OPS = ("entropy", "softmax", "logsumexp", "log_softmax", "float")


def tensor_lines(
    a: AllocationFailure, tensors: list[Tensor], vocab: int | None, failed_in: str = ""
) -> tuple[list[str], bool]:
    """Which tensor the request was, and whether labkit's model matched it (a factorisation is only a hint; raised
    in an entropy or softmax frame, the fp32 reading comes first)."""
    if a.device != "cuda" or a.requested is None or a.requested < 64 * 2**20:
        return [], False
    hit = match(a.requested, tensors) if tensors else None
    if hit is not None:
        return [f"the failed allocation: {_gib(a.requested)} = {hit.arithmetic}: {hit.what}"], True
    lines = []
    if tensors:
        lines.append(
            f"the failed allocation ({_gib(a.requested)}) matches none of the tensors labkit's model sizes for this "
            "phase: " + "; ".join(f"{t.what} {_gib(t.bytes)}" for t in tensors[:4])
        )
    guesses = factorisations(a.requested, vocab)
    if any(op in failed_in for op in FP32_OPS):
        guesses.sort(key=lambda g: not g.arithmetic.endswith("× 4 B"))
    if guesses:
        lines.append(
            f"{_gib(a.requested)} is consistent with "
            + " or ".join(f"{g.arithmetic} ({g.what})" for g in guesses)
            + (" (a hypothesis from the size alone" + (f", vocabulary {vocab:,})" if vocab else ")"))
        )
    return lines, False


def prediction(rep: MemoryReport, phase: str, a: AllocationFailure) -> tuple[list[str], list[dict[str, Any]], bool]:
    """labkit's peak for the failing phase beside the log's, the fixes (when labkit predicts the OOM too) and
    whether labkit's model explains the failure."""
    p = rep.phases[phase]
    state, left = rep.state(phase)
    needed = (a.allocated or 0) + (a.requested or 0)
    held = (a.capacity or 0) - (a.free or 0)
    if a.device == "engine-start":  # held by the rest + the engine's share
        needed = held + (a.requested or 0)
        log = f"; the log: {_gib(held)} held + {_gib(a.requested)} u·C = {_gib(needed)}"
    else:
        log = f"; the log: {_gib(a.allocated)} allocated + {_gib(a.requested)} requested = {_gib(needed)}"
    lines = [
        f"labkit predicts {phase} at {_gib(p.peak_bytes)} per GPU ({state}, {_gib(abs(left))} "
        f"{'left' if left >= 0 else 'over'}), largest terms: "
        + ", ".join(f"{k} {_gib(v)}" for k, v in list(p.terms.items())[:4])
        + (log if needed else "")
    ]
    placed = p.peak_bytes - p.info.get("engine_share_bytes", p.peak_bytes)
    if a.device == "engine-start" and held > placed + 2 * GiB:
        lines.append(
            f"the GPU held {_gib(held)} when the engine started, labkit's model places {_gib(placed)} there (the "
            f"training side and headroom): {_gib(held - placed)} more was held by something it does not model "
            "(another process on the GPU, an earlier engine not shut down, a leak); nvidia-smi shows it"
        )
    if state != "OOM":
        lines.append(
            f"labkit's model has {phase} fitting this GPU, so it does not explain this OOM: the lengths or a "
            "knob the log does not show differ, or memory outside the model (another process, a leak) was held"
        )
        return lines, [], False
    fixes = [f for f in rep.fixes if f["phase"] == phase]  # the report priced them: the same fixes memory gives
    for f in fixes[:6]:
        verdict = "verl accepts" if not f["verl_error"] else f"verl rejects it ({f['verl_error']})"
        lines.append(
            f"  fix: {f['set']}: {phase} {_gib(f['new_peak_bytes'])}"
            f"{' fits' if f['fits'] else ' still over'}; {f['cost']}; {verdict}"
        )
    return lines, fixes, True
