"""The memory answer in words (``labkit memory``'s text, the dashboard's and notebook 07's lines): each phase with
its peak, state and largest terms, what the answer assumed (lengths, the rollout engine, the log-prob head, LoRA,
headroom), every key it did not price, the verdict with verl's first, the fixes, the cheapest set and the way out.
"""

from __future__ import annotations

from typing import Any

from labkit.memory.fix_combine import MAX_SET
from labkit.memory.verdict import GiB, MemoryReport
from labkit.rules.parallel_layout import ParallelLayout

HEADS = {
    "flash_attn": "flash_attn's cross-entropy (verl with flash-attn installed; --head torch without it)",
    "torch": "verl's torch fallback, a log-softmax per token row (no flash_attn; --head torch)",
    "full_log_softmax": "a full fp32 log-softmax (labkit's CPU head)",
}
ENTROPY = {
    "fused": "inside the fused kernel (model.use_fused_kernels)",
    "compiled": "torch.compile'd (use_torch_compile, verl's default; an ideal fusion, no T×V temporaries)",
    "checkpointed": "eager, recomputed in backward (actor.entropy_checkpointing)",
    "chunked": "eager in chunks (actor.entropy_from_logits_with_chunking)",
    "eager": "eager under bf16 autocast (use_torch_compile=false: actor's in legacy, actor.fsdp_config's in the engine)",
}


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f} GiB"


def render_text(rep: MemoryReport, layout: ParallelLayout | None = None) -> str:
    """Per phase: the peak, its state (fits / tight / OOM) and margin, its three largest terms; the length
    assumption; the headroom terms; the verdict; the fixes. ``layout``: the training engine's (Megatron: the
    stages each phase was priced on)."""
    s = rep.settings
    lines = [f"{s.model.name} on {s.world_size} GPUs of {_gib(s.gpu_bytes)} ({s.profile} profile), per GPU:"]
    if rep.verl_error is not None:  # verl's verdict first: the memory below is what the config needs once fixed
        lines.insert(
            0,
            f"verl rejects this config ({rep.verl_error}): {rep.verl_message} (`labkit check` says why and how to fix "
            "it); the memory below is what the config would need once fixed",
        )
    if layout is not None and layout.is_megatron:
        lay = layout
        lines.insert(
            0,
            f"Megatron: TP {lay.tp} · PP {lay.pp} · CP {lay.cp} (VPP {lay.vpp or 1}, EP {lay.ep}) → D = {lay.dp_size}; "
            f"each phase is priced on every pipeline stage and shown at its worst",
        )
    for name, p in rep.phases.items():
        flag, left = rep.state(name)
        top = ", ".join(f"{k} {_gib(v)}" for k, v in list(p.terms.items())[:3])
        lines.append(
            f"  {name:<14} {_gib(p.peak_bytes):>13} {100 * p.peak_bytes / s.gpu_bytes:5.0f}%  {flag:<5} "
            f"{left / GiB:+7.2f} GiB  at {p.peak_instant}: {top}"
        )
        if p.info.get("micro_batch"):
            lines.append(f"  {'':<14} micro-batch: {p.info['micro_batch']}, {p.info['tokens']:,} tokens per GPU")
        if p.info.get("stage_peaks"):
            peaks = ", ".join(f"{k}: {_gib(v)}" for k, v in p.info["stage_peaks"].items())
            lines.append(
                f"  {'':<14} per pipeline stage: {peaks}; worst stage {p.info['worst_stage']}"
                + (f" ({p.info['in_flight']} forwards in flight)" if p.info.get("in_flight") else "")
            )
        if p.info.get("typical_tokens") is not None and p.info["typical_tokens"] != p.info.get("tokens"):
            lines.append(
                f"  {'':<14} typical micro-batch: {p.info['typical_tokens']:,} tokens, peak "
                f"{_gib(p.info['typical_peak_bytes'])}"
            )
        if name == "generate":
            lines.append(
                f"  {'':<14} KV pool holds {p.info['sequences_that_fit']:,} sequences of max_model_len "
                f"{s.max_model_len:,}; {p.info['sequences_in_flight']:,} in flight (max_num_seqs "
                f"{s.max_num_seqs:,})"
            )
            if p.info.get("engine_error"):
                lines.append(f"  {'':<14} the engine cannot start: {p.info['engine_error']}")
    lines.append(f"lengths: {rep.lengths}")
    lines.extend(_model_lines(rep))
    if layout is not None and layout.engine == "veomni":
        lines.append(
            f"VeOmni: priced as FSDP over D = {layout.dp_size} (Ulysses {layout.ulysses_sp}); its expert parallelism "
            f"(EP {layout.ep}) is not modelled: experts are sharded with the rest"
        )
    if layout is not None and layout.is_megatron:
        lines.append("log-prob head: vocabulary-parallel logits [tokens, V/TP] on the last stage, fp32 log-softmax")
    else:
        lines.append(f"log-prob head: {HEADS[s.logprob_kernel]}; entropy: {ENTROPY[s.entropy_mode]}")
    lines.append(
        f"headroom in every phase: cuda_context {_gib(s.cuda_context_bytes)}, cublas_workspace "
        f"{_gib(s.cublas_workspace_bytes)}, nccl_buffers {_gib(s.nccl_bytes)}, allocator_reserve "
        f"{100 * s.reserve_fraction:.0f}% of the allocated peak; margin {_gib(s.margin_bytes)} (--margin)"
    )
    lines.extend(not_priced_lines(rep.not_priced))
    short = [n for n in rep.phases if rep.state(n)[0] != "fits"]
    if not short:
        least = min(rep.state(n)[1] for n in rep.phases)
        if rep.verdict == "fits_unless":
            lines.append(f"verdict: fits at these lengths, at least {_gib(least)} left; {_unless(rep)}.")
        else:
            lines.append(f"verdict: every phase fits, at least {_gib(least)} left (margin {_gib(s.margin_bytes)}).")
        return "\n".join(lines)
    if rep.first_oom is None:
        left = {n: rep.state(n)[1] for n in short}
        lines.append(
            "verdict: tight: "
            + ", ".join(f"{n} leaves {_gib(v)}" for n, v in left.items())
            + f", under the margin of {_gib(s.margin_bytes)}; the allocator's fragmentation may tip it over."
        )
    else:
        p = rep.phases[rep.first_oom]
        over = p.peak_bytes - s.gpu_bytes
        why = f"exceeds the GPU by {_gib(over)}" if over > 0 else "cannot start its engine"
        at = " at full width" if rep.full_width is None else " even at these lengths"
        lines.append(
            f"verdict: {rep.first_oom} is the first phase that OOMs{at}: it {why} (largest term: "
            f"{next(iter(p.terms))})."
        )
        if rep.full_width is None and rep.break_even.get(rep.first_oom):
            lines.append(f"  {_while(rep, rep.first_oom)}")
    lines.append("fixes (each alone, new predicted peak of that phase; * = the whole step then fits):")
    for f in rep.fixes:
        mark = "*" if f["step_fits"] else (" " if f["fits"] else "-")
        state = "fits" if f["fits"] else "still short"
        verl = (
            "verl accepts it"
            if f["verl_error"] is None
            else f"verl rejects it ({f['verl_error']})"
            if f["verl_error"] != rep.verl_error
            else f"verl still rejects the config ({rep.verl_error})"
        )
        lines.append(
            f"  {mark} [{f['phase']}] {f['set']}{_was(f)}: {_gib(f['new_peak_bytes'])} ({state}); {verl}; "
            f"cost: {f['cost']}"
        )
    lines.extend(f"  {line}" for line in way_out_lines(rep))
    return "\n".join(lines)


def way_out_lines(rep: MemoryReport) -> list[str]:
    """When no single fix makes the whole step fit: the cheapest set that does, with its costs, or what would."""
    if rep.combined_fix is not None:
        c = rep.combined_fix
        verl = "verl accepts it" if c["verl_error"] is None else f"verl rejects it ({c['verl_error']})"
        top = max(c["peaks"].values())
        return [
            f"no single knob makes the whole step fit; together: {c['set']}: every phase fits (highest peak "
            f"{_gib(top)}); {verl}",
            *(f"  cost of {knob}: {cost}" for knob, cost in zip(c["knobs"], c["costs"], strict=True)),
        ]
    if rep.way_out is not None:
        return [
            "no knob labkit prices makes the whole step fit, alone or together (up to "
            f"{MAX_SET} at once); what would: {rep.way_out}"
        ]
    return []


NOT_PRICED = {
    "not_priced": "not priced",
    "not_read": "not read here",
    "no_effect": "no effect in verl",
    "not_verl": "not a verl key",
    "read_past": "read past",
}


def not_priced_lines(items: list[dict[str, str]]) -> list[str]:
    """One line per key the config sets that the answer did not price: what it is and what it would change."""
    return [
        f"{NOT_PRICED[i['effect']]}: {i['key']}"
        + (f"={i['value']}" if i["effect"] != "read_past" else "")
        + f": {i['text']}"
        for i in items
    ]


def break_even_line(rep: MemoryReport) -> str:
    """The break-even of every phase that does not fit at full width, in one line (the dashboard's, 07's)."""
    parts = [
        _while(rep, name) if tokens else f"{name} does not fit at any length (its lengths do not move it)"
        for name, tokens in rep.break_even.items()
    ]
    return "at full width: " + "; ".join(parts) if parts else ""


def _while(rep: MemoryReport, phase: str) -> str:
    """``it fits while responses stay under N tokens`` for one phase's break-even."""
    return (
        f"{phase} fits while responses stay within {rep.break_even[phase]:,} tokens (every sample "
        f"{rep.prompt_tokens:,} prompt + that many response tokens, packed)"
    )


def _unless(rep: MemoryReport) -> str:
    """``unless responses reach N tokens``: the phases that do not fit at full width and their break-evens."""
    full = rep.full_width or {}
    parts = []
    for name, tokens in rep.break_even.items():
        need = _gib(full[name].peak_bytes) if name in full else "?"
        reach = f"responses reach {tokens + 1:,} tokens" if tokens else "rows reach full width"
        parts.append(f"{name} OOMs if {reach} (at full width it needs {need})")
    return "not at full width: " + "; ".join(parts) if parts else "not at full width"


def _model_lines(rep: MemoryReport) -> list[str]:
    """What the answer assumed of the model and the rollout engine: MoE's total and active parameters, the image
    tokens of a vision-language model, the attention kinds priced as full attention, the engine's memory split."""
    m, out = rep.settings.model, []
    lora = rep.settings.lora
    if lora is not None:
        slots = f"vLLM's LoRA slots of rank {lora.rollout_rank}" if lora.rollout_rank else "merged into vLLM's weights"
        out.append(
            f"LoRA: rank {lora.rank} adapters on {lora.adapters_per_layer} linears a layer ({lora.params / 1e6:,.1f}M "
            "params, with their grads and Adam states in fp32); the base frozen, no full-size grads or Adam states; "
            f"the reference is the actor with adapters off; rollout: {slots}"
        )
    if m.is_moe:
        out.append(
            f"params: {m.param_count() / 1e9:,.2f}B total (all experts sit in each FSDP or EP shard's memory), "
            f"{m.active_param_count() / 1e9:,.2f}B active per token"
        )
    infos = [p.info for p in rep.phases.values()]
    for key, label in (
        ("vision_assumption", "assumed"),
        ("not_modelled", "not modelled"),
        ("quantized_weights", "not modelled"),
        ("rollout_engine", "rollout"),
    ):
        seen = []
        for info in infos:
            value = info.get(key)
            for v in value if isinstance(value, (list, tuple)) else [value] if value else []:
                if v not in seen:
                    seen.append(v)
        out.extend(f"{label}: {v}" for v in seen)
    return out


def _was(fix: dict[str, Any]) -> str:
    """`` (now X)``: what the fix changes from, when the search recorded it."""
    return f" (now {fix['from']})" if fix.get("from") else ""
