"""``labkit memory --trace``: the formula's phase beside a fake-CUDA trace of its largest micro-batch.

The trace itself is compute (``labkit.model.memory_trace``, run by ``labkit.model.trace_runner.run_trace``); this
module only says what to trace for a phase (``trace_spec``), which formula terms a trace can see (``TRANSIENT``:
the pass's own allocations above the weights; model states, FSDP's gathered copies and the headroom terms are
outside it) and prints the two side by side (``trace_lines``). ``labkit.cli`` passes the tracer in, so this layer
imports no tensors.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from labkit.memory.phase_records import PassShape, Phase
from labkit.memory.phases import forward_pass, update_pass
from labkit.memory.settings import MemorySettings

GiB = 2**30
NOT_TRACED = (
    "params",
    "grads",
    "optimizer",
    "ref_params",
    "critic_params",
    "critic_grads",
    "critic_optimizer",
    "rollout_share",
    "gathered_params",
    "layer_grads",
    "adam_temporaries",
    "cuda_context",
    "cublas_workspace",
    "nccl_buffers",
    "allocator_reserve",
)
"""Terms a trace of one micro-batch's pass does not hold above its weights."""


def traced_instant(p: Phase) -> str:
    """The instant whose traced terms are largest: where a trace of the pass peaks (the phase's own peak instant
    can differ, its model states and FSDP's whole-layer gradients being outside any trace)."""
    return max(p.instants, key=lambda k: sum(transient_terms(p, k).values()))


def transient_terms(p: Phase, instant: str | None = None) -> dict[str, int]:
    """The terms of ``instant`` (``traced_instant`` by default) that a trace sees: the pass's own tensors, and of
    FSDP's unsharded ``layer_grads`` the one gradient being written (the trace frees each as it is made; a MoE
    layer's stacked expert weights make that one large: ``labkit.memory.term_bytes.largest_param_grad``)."""
    if instant is None:
        instant = traced_instant(p)
    live = p.instants[instant]
    out = {k: v for k, v in live.items() if k not in NOT_TRACED and v}
    one = min(live.get("layer_grads", 0), int(p.info.get("traced_layer_grad", 0)))
    return {**out, "layer_grads": one} if one else out


def trace_spec(s: MemorySettings, name: str, p: Phase) -> dict[str, Any]:
    """What to trace for phase ``name``: its largest micro-batch as packed sequences (the whole SP group's: the trace
    feeds one rank's slice), and the head as the settings run it (entropy mode, head kernel, fused kernels,
    temperature)."""
    sp = max(1, s.critic_sp if name in ("values", "update_critic") else s.actor_sp)
    tokens, rows = int(p.info["tokens"]) * sp, max(1, int(p.info.get("rows") or 1))  # the SP group's micro-batch
    width = max(1, tokens // rows)
    padded = "" if s.remove_padding or sp > 1 else s.profile
    if padded:  # each row padded to the width; the real tokens spread over the rows
        real = int(p.info.get("real_tokens") or tokens)
        seqs = [real // rows + (1 if r < real % rows else 0) for r in range(rows)]
        width = max(width, max(seqs))
    else:
        seqs = [width] * (tokens // width) + ([tokens % width] if tokens % width else [])
    update = name.startswith("update")
    wants_entropy = name == "old_log_prob" or (update and s.update_entropy)
    mode = s.entropy_mode
    if not wants_entropy:
        entropy = "none"
    elif mode == "fused":
        entropy = "eager"  # the fused kernel computes it from its chunks
    else:
        entropy = "eager" if mode == "checkpointed" and not update else mode
    return {
        "model": s.model,
        "seq_lengths": seqs,
        "update": update,
        "entropy": entropy,
        "checkpointing": bool(s.gradient_checkpointing),
        "head": "torch" if s.logprob_kernel == "torch" else "flash_attn",
        "fused": s.fused_kernels,
        "entropy_chunk": s.entropy_chunk_size,
        "temperature": s.temperature,
        "temperature_copy": s.temperature_copy,
        "sp": sp,
        "padded": padded,
        "profile": s.profile,
        "width": width if padded else 0,
        "response_length": min(s.response_length, width - 1) if padded == "legacy" else 0,
        "layers": trace_layers(s),
        **({"image_tokens": s.image_tokens_per_sample} if s.model.vision is not None and not padded else {}),
        **({"lora": lora_trace(s, name)} if s.lora is not None and name in ACTOR_PASSES else {}),
    }


ACTOR_PASSES = ("old_log_prob", "ref_log_prob", "update_actor")
"""The passes LoRA's adapters are in (the critic has none); the reference runs with them disabled."""


def lora_trace(s: MemorySettings, name: str) -> dict[str, Any]:
    """The adapters for the trace (``labkit.model.trace_lora``): the rank, the linears ``s.lora`` adapts in any
    layer (``labkit.memory.lora``'s names), enabled but in the reference pass."""
    assert s.lora is not None
    names = sorted({x.name for layer in s.lora.targets for x in layer})
    return {"rank": s.lora.rank, "targets": names, "enabled": name != "ref_log_prob"}


TRACE_LAYERS = 4
"""Decoder layers a MoE model is traced with: its layers share one shape, so the per-layer peak is the full model's
(the formula is then held to a model of as many layers: ``traced_settings``); dense models trace every layer."""


def trace_layers(s: MemorySettings) -> int:
    """0 (every layer) for a dense model, ``TRACE_LAYERS`` for a MoE one."""
    return TRACE_LAYERS if s.model.is_moe and s.model.num_hidden_layers > TRACE_LAYERS else 0


def traced_settings(s: MemorySettings) -> MemorySettings:
    """The settings of the model the trace builds (``trace_layers`` decoder layers), for the formula beside it."""
    n = trace_layers(s)
    return replace(s, model=replace(s.model, num_hidden_layers=n)) if n else s


def trace_lines(s: MemorySettings, name: str, p: Phase, spec: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """The trace's peak, instant and alive tensors beside the formula's transient terms, and the stand-ins. A MoE
    model is traced with ``trace_layers`` decoder layers: the formula beside it prices a model of as many."""
    cut = int(spec.get("layers") or 0)
    if cut:
        p = _phase(traced_settings(s), name, p)
    formula = transient_terms(p)
    total = sum(formula.values())
    traced = int(result["peak_bytes"])
    flags = ", ".join(f"{k}={spec[k]}" for k in ("update", "entropy", "checkpointing", "head", "fused", "temperature"))
    n, tokens = len(spec["seq_lengths"]), sum(spec["seq_lengths"])
    if spec.get("padded"):
        fed = f"{tokens:,} tokens in {n} rows padded to {spec['width']:,} ({spec['padded']}'s padded path"
        fed += f", the head on the last {spec['response_length']:,} positions)" if spec["response_length"] else ")"
    else:
        fed = f"{tokens:,} tokens packed in {n} sequences, 1/{spec['sp']} of them on this rank"
    if cut:
        fed += f"; {cut} of its {s.model.num_hidden_layers} decoder layers, the formula for as many"
    if spec.get("lora"):
        fed += f"; LoRA rank {spec['lora']['rank']} adapters {'on' if spec['lora']['enabled'] else 'off'}, base frozen"
    lines = [
        f"trace of {name} ({s.model.name}, {fed}; {flags}; fake CUDA, bf16 autocast):",
        f"  traced peak above the weights: {traced / GiB:,.2f} GiB at {result['op']} in {result['module']}",
        f"  formula at {traced_instant(p)}: {total / GiB:,.2f} GiB of pass tensors ("
        + ", ".join(f"{k} {v / GiB:,.2f}" for k, v in formula.items())
        + f"); formula / trace = {total / max(traced, 1):.2f}",
        "  alive at the traced peak (largest first):",
    ]
    for a in result["alive"][:8]:
        lines.append(
            f"    {a['bytes'] / GiB:8.2f} GiB  {a['dtype'].removeprefix('torch.'):<9} {a['shape']}  from {a['op']}"
        )
    lines.append(f"  stand-ins (no fake tensor runs them): {'; '.join(result['stand_ins']) or 'none in this pass'}")
    return lines


def _phase(s: MemorySettings, name: str, p: Phase) -> Phase:
    """``p``'s pass priced again with settings ``s`` (the same micro-batch)."""
    shape = PassShape(int(p.info["rows"]), int(p.info["tokens"]), p.info.get("real_tokens"))  # type: ignore[arg-type]
    return (update_pass if name.startswith("update") else forward_pass)(s, name, shape)
