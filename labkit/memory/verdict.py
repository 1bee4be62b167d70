""" "Why did it OOM?": the first phase whose peak exceeds the GPU, and the verl knobs that would fix it, each with
its new predicted peak and what it costs. A fix is a config override re-evaluated by the same model (no guessing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from labkit.config.keys import ACTOR, MODEL, REF, ROLLOUT
from labkit.config.verl_config import VerlConfig
from labkit.memory.headroom import state
from labkit.memory.phases import Phase
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import PASS_KEYS, config_shape, step_phases, trace_phases
from labkit.rules.catalogue import catalogue
from labkit.trace import StepTrace
from labkit.validate.report import check

GiB = 2**30


@dataclass
class MemoryReport:
    """Per-phase peaks of one step on one GPU, the first phase over capacity, and the fixes."""

    settings: MemorySettings
    phases: dict[str, Phase]
    first_oom: str | None
    fixes: list[dict[str, Any]]
    lengths: str = "every row at full width (prompt_length + response_length)"
    """The length assumption the verdict rests on."""
    verl_error: str | None = None
    """The code of the error verl raises for the config itself (None: it accepts it); each fix has its own."""

    def state(self, name: str) -> tuple[str, int]:
        """``("fits" | "tight" | "OOM", bytes left)`` of one phase (``labkit.memory.headroom.state``)."""
        p = self.phases[name]
        return state(self.settings, p.peak_bytes, p.info.get("engine_error"))

    def to_dict(self, details: bool = False) -> dict[str, Any]:
        """``{"phases": {NAME: {"peak_bytes": int, "terms": {TERM: bytes}}}, "first_oom": NAME|null, "fixes": [...]}``
        (``labkit memory --json``); ``details`` adds each phase's peak instant and derived facts, and the model,
        GPU and profile."""
        phases: dict[str, dict[str, Any]] = {}
        for n, p in self.phases.items():
            verdict, left = self.state(n)
            phases[n] = {"peak_bytes": p.peak_bytes, "terms": p.terms, "state": verdict, "left_bytes": left}
            if details:
                phases[n].update(peak_instant=p.peak_instant, info=p.info)
        out: dict[str, Any] = {
            "phases": phases,
            "first_oom": self.first_oom,
            "fixes": self.fixes,
            "capacity_bytes": self.settings.gpu_bytes,
            "margin_bytes": self.settings.margin_bytes,
            "lengths": self.lengths,
            "verl_error": self.verl_error,
        }
        if details:
            out.update(model=self.settings.model.name, gpu_bytes=self.settings.gpu_bytes, profile=self.settings.profile)
        return out


def _fails(s: MemorySettings, p: Phase) -> bool:
    return p.peak_bytes > s.gpu_bytes or bool(p.info.get("engine_error"))


def _short(s: MemorySettings, p: Phase) -> bool:
    """OOM or tight: the phase needs a fix ("fits" never means less than the margin left)."""
    return state(s, p.peak_bytes, p.info.get("engine_error"))[0] != "fits"


def first_oom(s: MemorySettings, phases: dict[str, Phase]) -> str | None:
    """The first phase (trace order) that exceeds the GPU, or whose engine cannot start."""
    return next((n for n, p in phases.items() if _fails(s, p)), None)


Evaluate = Callable[[VerlConfig, MemorySettings], dict[str, Phase]]


def _with(cfg: VerlConfig, **values: Any) -> VerlConfig:
    return VerlConfig(cfg.profile, {**cfg.values, **values}, dict(cfg.ignored))


def _candidates(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[tuple[str, list[dict], str]]:
    """(knob, [overrides or settings changes to try, most generous first], cost) for one failing phase."""
    out: list[tuple[str, list[dict], str]] = []
    if phase in PASS_KEYS:
        rows_key, dyn_key, budget_key, sp_key = PASS_KEYS[phase]
        forward_only = not phase.startswith("update")
        if not cfg.get(dyn_key):
            m = config_shape(cfg, phase)[0].rows  # the per-GPU rows, also when a deprecated global size set them
            deprecated = rows_key.removesuffix("_per_gpu")  # verl refuses both set: drop the global size
            drop = {deprecated: None} if deprecated in cfg.values and cfg.get(deprecated) is not None else {}
            tries = [{rows_key: r, **drop} for r in (m // 2**k for k in range(1, 12)) if r >= 1]
            what = (
                "log-probs unchanged up to bf16 kernel drift" if forward_only else "same gradient (more accumulation)"
            )
            out.append((rows_key, tries, f"more micro-batches, more time; {what}"))
        longest = s.max_model_len
        budgets = [b for b in (2**k for k in range(20, 9, -1)) if b >= longest]
        # the engine's old log-prob follows actor.use_dynamic_bsz (0.9.1 asserts the two flags agree)
        engine_old = cfg.profile == "engine" and phase == "old_log_prob"
        flags = {dyn_key: True, **({f"{ACTOR}.use_dynamic_bsz": True} if engine_old else {})}
        tries = [{**flags, budget_key: b} for b in budgets]
        out.append(
            (
                f"{dyn_key}=true + {budget_key}",
                tries,
                "token-balanced micro-batches; the budget must be ≥ the "
                f"longest sequence ({longest:,}); legacy scales the loss per micro-batch"
                + ("; the engine's update turns dynamic too" if engine_old else ""),
            )
        )
        sp = cfg.get(sp_key)
        if s.world_size % (2 * sp) == 0 and s.model.num_attention_heads % (2 * sp) == 0:
            out.append(
                (
                    sp_key,
                    [{sp_key: 2 * sp}],
                    "Ulysses all-to-alls per layer; halves DP; a dynamic budget is "
                    "multiplied by SP, so it only helps with a static micro-batch or a smaller budget",
                )
            )
    if phase in ("old_log_prob", "ref_log_prob", "update_actor") and not s.fused_kernels:
        out.append(
            (
                f"{MODEL}.use_fused_kernels",
                [{"fused_kernels": True}],
                "log-probs from hidden states 512 tokens at a time, no full logits; a different kernel "
                "(verl's FusedLinearForPPO), the same math up to bf16 rounding",
            )
        )
    if (phase == "old_log_prob" or (phase == "update_actor" and s.update_entropy)) and not s.entropy_compiled:
        out.append(
            (
                f"{ACTOR}.use_torch_compile",
                [{"entropy_compiled": True}],
                "torch.compile's first-step compile time; the same entropy up to fusion rounding",
            )
        )
    if phase == "old_log_prob" and not s.entropy_chunking:
        out.append(
            (
                f"{ACTOR}.entropy_from_logits_with_chunking",
                [{"entropy_chunking": True}],
                "a little time (2,048 rows at a time); same entropy",
            )
        )
    if phase.startswith("update") and not s.gradient_checkpointing:
        out.append(
            (
                f"{MODEL}.enable_gradient_checkpointing",
                [{"gradient_checkpointing": True}],
                "one more forward per micro-batch (~+33% update compute); same gradient",
            )
        )
    if not s.param_offload:
        out.append(
            (
                f"{ACTOR}.fsdp_config.param_offload",
                [{"param_offload": True}],
                "params cross PCIe twice a step; same math",
            )
        )
    if not s.optimizer_offload:
        out.append(
            (
                f"{ACTOR}.fsdp_config.optimizer_offload",
                [{"optimizer_offload": True}],
                "Adam states cross PCIe once a step; same math",
            )
        )
    if s.need_ref and not s.ref_param_offload:
        out.append(
            (f"{REF}.fsdp_config.param_offload", [{"ref_param_offload": True}], "ref params cross PCIe; same math")
        )
    if not s.free_cache_engine:
        out.append(
            (
                f"{ROLLOUT}.free_cache_engine",
                [{"free_cache_engine": True}],
                "the engine sleeps and wakes each step (seconds); same math",
            )
        )
    u = s.gpu_memory_utilization
    tries = [{"gpu_memory_utilization": round(u - 0.05 * k, 2)} for k in range(1, 20) if u - 0.05 * k > 0.04]
    out.append(
        (
            f"{ROLLOUT}.gpu_memory_utilization",
            tries,
            "a smaller KV pool: fewer sequences in flight, slower generation (preemption); same math",
        )
    )
    seqs = [{"max_num_seqs": s.max_num_seqs // 2**k} for k in range(1, 8) if s.max_num_seqs // 2**k >= 1]
    out.append((f"{ROLLOUT}.max_num_seqs", seqs, "fewer rollout sequences in flight: lower generation throughput"))
    return out


def _apply(cfg: VerlConfig, s: MemorySettings, change: dict) -> tuple[VerlConfig, MemorySettings, str]:
    fields = {k: v for k, v in change.items() if "." not in k}
    keys = {k: v for k, v in change.items() if "." in k}
    new_cfg = _with(cfg, **keys) if keys else cfg
    new_s = replace(s, **fields) if fields else s
    if keys and any(k.endswith("ulysses_sequence_parallel_size") for k in keys):
        new_s = replace(new_s, actor_sp=new_cfg.get(f"{ACTOR}.ulysses_sequence_parallel_size"))
    text = ", ".join(
        f"~{k}" if v is None else f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()
    )
    return new_cfg, new_s, text


catalogue()  # every fix is checked against verl's rules, whose messages come from the catalogue: read it once, here


def verl_error(cfg: VerlConfig) -> str | None:
    """The code of the first error verl raises for ``cfg`` (``labkit check``'s verdict), None when it accepts: a fix
    that verl refuses is no fix."""
    first = check(cfg).first_error
    return None if first is None else first.code


def fixes_for(
    cfg: VerlConfig, s: MemorySettings, phase: str, evaluate: Evaluate, base_error: str | None
) -> list[dict[str, Any]]:
    """Each knob's most generous value that makes ``phase`` fit (or its best try), the new peaks, the cost, and
    verl's verdict on the changed config (``base_error``, the config's own, for a change of settings only)."""
    out = []
    for knob, tries, cost in _candidates(cfg, s, phase):
        best = None
        for change in tries:
            new_cfg, new_s, text = _apply(cfg, s, change)
            phases = evaluate(new_cfg, new_s)
            if phase not in phases:
                continue
            fits = not _short(new_s, phases[phase])
            setting = text or ", ".join(
                f"{knob}={str(v).lower() if isinstance(v, bool) else v}" for v in change.values()
            )
            best = (setting, phases, fits, new_s, new_cfg)
            if fits:
                break
        if best is None:
            continue
        setting, phases, fits, new_s, new_cfg = best
        if not fits and phases[phase].peak_bytes >= evaluate(cfg, s)[phase].peak_bytes:
            continue  # this knob does not move this phase
        out.append(
            {
                "knob": knob,
                "set": setting,
                "phase": phase,
                "new_peak_bytes": phases[phase].peak_bytes,
                "fits": fits,
                "step_fits": not any(_short(new_s, p) for p in phases.values()),
                "cost": cost,
                "verl_error": base_error if new_cfg is cfg else verl_error(new_cfg),
            }
        )
    out.sort(key=lambda f: (not f["fits"], not f["step_fits"], f["new_peak_bytes"]))
    return out


def memory_report(
    cfg: VerlConfig,
    s: MemorySettings,
    lengths: Sequence[int] | str | None = None,
    seed: int = 0,
    trace: StepTrace | None = None,
    label: str | None = None,
) -> MemoryReport:
    """The step's phases (from the plan's micro-batches for ``lengths``, else the config's worst case: every sample
    at full width), the verdict and the fixes of every failing phase, the first failing phase's first. ``trace``:
    the plan of ``cfg`` for these lengths when the caller has it already (the dashboard); ``label``: the lengths'
    name (a profile) when ``lengths`` is the list drawn from it."""
    if lengths is None:
        evaluate: Evaluate = step_phases
    else:
        from labkit.plan.step import plan

        base = trace if trace is not None else plan(cfg, lengths, seed=seed)  # settings-only fixes reuse it

        def evaluate(c: VerlConfig, st: MemorySettings) -> dict[str, Phase]:
            return trace_phases(base if c is cfg else plan(c, lengths, seed=seed), c, st)

    phases = evaluate(cfg, s)
    base_error = verl_error(cfg)
    fixes = [f for name, p in phases.items() if _short(s, p) for f in fixes_for(cfg, s, name, evaluate, base_error)]
    how = (
        "every row at full width (prompt_length + response_length)"
        if lengths is None
        else f"lengths {label or (lengths if isinstance(lengths, str) else f'given ({len(lengths):,} samples)')}: "
        "the largest micro-batch on any GPU (worst case), the median one (typical case)"
    )
    return MemoryReport(s, phases, first_oom(s, phases), fixes, how, base_error)
