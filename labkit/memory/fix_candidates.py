"""The verl knobs "why did it OOM?" tries for a phase that does not fit: one ``Candidate`` per knob, its values the
smallest change first, what it costs and its tier. ``labkit.memory.fix_search.fixes_for`` re-evaluates each value with
the same memory model and keeps the first that fits.

Each family of knobs is one function ``(cfg, settings, phase) -> list[Candidate]`` (the larger moves are in
``labkit.memory.fix_scale``; ``labkit.memory.fix_knobs`` lists the families per engine). A value is a
change of config keys (dotted, ``None`` deletes the key) or of ``MemorySettings`` fields (a knob the settings read
from the config, named by ``Candidate.knob``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from labkit.config.keys import ACTOR, MODEL, REF, ROLLOUT
from labkit.config.verl_config import VerlConfig
from labkit.memory.phases import generate
from labkit.memory.settings import MemorySettings
from labkit.memory.settings_keys import compile_key, critic_fsdp
from labkit.memory.step_memory import PASS_KEYS, config_shape

FREE, TIME, COMMUNICATION, DIFFERENT_RUN = 0, 1, 2, 3
"""A fix's tier, what it costs in kind: nothing but a kernel or a compile, time, host or network traffic (offload,
a parallel size), a different run (LoRA, more nodes). A set of fixes is cheaper when its dearest tier is lower."""
KINDS = ("kernel", "time", "traffic", "another run")
"""Each tier's word in a fix's ``kind`` (``--json``)."""


class Candidate(NamedTuple):
    """One knob: ``tries`` (changes, the smallest change first), ``cost`` (what the user pays for it) and its tier."""

    knob: str
    tries: list[dict[str, Any]]
    cost: str
    tier: int = TIME


CandidateSource = Callable[[VerlConfig, MemorySettings, str], list[Candidate]]


def micro_rows(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """Fewer rows per static micro-batch (the pass's ``*_micro_batch_size_per_gpu``), halving down to 1."""
    if phase not in PASS_KEYS:
        return []
    rows_key, dyn_key, _, _ = PASS_KEYS[phase]
    if cfg.get(dyn_key):
        return []
    m = config_shape(cfg, phase)[0].rows  # the per-GPU rows, also when a deprecated global size set them
    deprecated = rows_key.removesuffix("_per_gpu")  # verl refuses both set: drop the global size
    drop = {deprecated: None} if cfg.is_set(deprecated) and cfg.get(deprecated) is not None else {}
    tries = [{rows_key: r, **drop} for r in (m // 2**k for k in range(1, 12)) if r >= 1]
    update = phase.startswith("update")
    what = "same gradient (more accumulation)" if update else "log-probs unchanged up to bf16 kernel drift"
    return [Candidate(rows_key, tries, f"more micro-batches, more time; {what}")]


def token_budget(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """Token-budget micro-batches (turned on where they are off), budgets from 2^20 down to the longest sequence."""
    if phase not in PASS_KEYS:
        return []
    _, dyn_key, budget_key, _ = PASS_KEYS[phase]
    longest = s.max_model_len
    budgets = [b for b in (2**k for k in range(20, 9, -1)) if b >= longest]
    # the engine's old log-prob follows actor.use_dynamic_bsz (0.9.1 asserts the two flags agree)
    engine_old = cfg.profile == "engine" and phase == "old_log_prob"
    flags = {dyn_key: True, **({f"{ACTOR}.use_dynamic_bsz": True} if engine_old else {})}
    on = all(cfg.get(k) for k in flags)
    knob = budget_key if on else f"{dyn_key}=true + {budget_key}"
    cost = (
        f"token-balanced micro-batches; the budget must be ≥ the longest sequence ({longest:,}); legacy scales the "
        "loss per micro-batch" + ("; the engine's update turns dynamic too" if engine_old and not on else "")
    )
    return [Candidate(knob, [{**flags, budget_key: b} for b in budgets], cost)]


def ulysses(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """Twice the Ulysses SP size, where the GPUs and the attention heads divide by it."""
    if phase not in PASS_KEYS:
        return []
    sp_key = PASS_KEYS[phase][3]
    sp = cfg.get(sp_key)
    if s.world_size % (2 * sp) or s.model.num_attention_heads % (2 * sp):
        return []
    cost = (
        "Ulysses all-to-alls per layer; halves DP; a dynamic budget is multiplied by SP, so it only helps with a "
        "static micro-batch or a smaller budget"
    )
    return [Candidate(sp_key, [{sp_key: 2 * sp}], cost, COMMUNICATION)]


def log_prob_head(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """The head of a log-prob pass: fused kernels, the compiled entropy, the chunked entropy."""
    out = []
    if phase in ("old_log_prob", "ref_log_prob", "update_actor") and not s.fused_kernels:
        cost = (
            "log-probs from hidden states 512 tokens at a time, no full logits; a different kernel (verl's "
            "FusedLinearForPPO), the same math up to bf16 rounding"
        )
        out.append(Candidate(f"{MODEL}.use_fused_kernels", [{"fused_kernels": True}], cost, FREE))
    if (phase == "old_log_prob" or (phase == "update_actor" and s.update_entropy)) and not s.entropy_compiled:
        cost = "torch.compile's first-step compile time; the same entropy up to fusion rounding"
        out.append(Candidate(compile_key(cfg.profile), [{"entropy_compiled": True}], cost, FREE))
    if phase == "old_log_prob" and not s.entropy_chunking:
        cost = "a little time (2,048 rows at a time); same entropy"
        out.append(Candidate(f"{ACTOR}.entropy_from_logits_with_chunking", [{"entropy_chunking": True}], cost))
    return out


def checkpointing(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """Gradient checkpointing for an update."""
    if not phase.startswith("update") or s.gradient_checkpointing:
        return []
    cost = "one more forward per micro-batch (~+33% update compute); same gradient"
    return [Candidate(f"{MODEL}.enable_gradient_checkpointing", [{"gradient_checkpointing": True}], cost)]


def offload(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """FSDP's parameter and optimizer offload (actor, reference, critic)."""
    params, adam = "params cross PCIe twice a step; same math", "Adam states cross PCIe once a step; same math"
    critic = critic_fsdp(cfg.profile)
    wanted = [
        (not s.param_offload, f"{ACTOR}.fsdp_config.param_offload", "param_offload", params),
        (not s.optimizer_offload, f"{ACTOR}.fsdp_config.optimizer_offload", "optimizer_offload", adam),
        (
            s.need_ref and not s.ref_offloaded and not s.ref_param_offload,
            f"{REF}.fsdp_config.param_offload",
            "ref_param_offload",
            "ref params cross PCIe; same math",
        ),
        (s.need_critic and not s.critic_param_offload, f"{critic}.param_offload", "critic_param_offload", params),
        (
            s.need_critic and not s.critic_optimizer_offload,
            f"{critic}.optimizer_offload",
            "critic_optimizer_offload",
            adam,
        ),
    ]
    return [Candidate(knob, [{field: True}], cost, COMMUNICATION) for want, knob, field, cost in wanted if want]


def rollout_pool(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """The rollout engine: sleep between steps, a smaller KV pool, fewer sequences in flight."""
    out = []
    if not s.free_cache_engine:
        cost = "the engine sleeps and wakes each step (seconds); same math"
        out.append(Candidate(f"{ROLLOUT}.free_cache_engine", [{"free_cache_engine": True}], cost))
    u = s.gpu_memory_utilization
    if phase == "generate" and generate(s).info["engine_error"]:  # the share holds no KV pool: a larger one
        tries = [{"gpu_memory_utilization": round(u + 0.05 * k, 2)} for k in range(1, 20) if u + 0.05 * k < 0.96]
        cost = "a larger engine share: room for its KV pool, less left for what else the GPU holds; same math"
    else:
        tries = [{"gpu_memory_utilization": round(u - 0.05 * k, 2)} for k in range(1, 20) if u - 0.05 * k > 0.04]
        cost = "a smaller KV pool: fewer sequences in flight, slower generation (preemption); same math"
    out.append(Candidate(f"{ROLLOUT}.gpu_memory_utilization", tries, cost))
    seqs = [{"max_num_seqs": s.max_num_seqs // 2**k} for k in range(1, 8) if s.max_num_seqs // 2**k >= 1]
    out.append(
        Candidate(f"{ROLLOUT}.max_num_seqs", seqs, "fewer rollout sequences in flight: lower generation throughput")
    )
    return out


MEG = f"{ACTOR}.megatron"
TRAINED = ("old_log_prob", "ref_log_prob", "update_actor", "values", "update_critic")


def megatron_sizes(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """Megatron's parallel sizes: twice the PP (fewer layers and states per stage), virtual stages, twice the CP
    (each GPU holds half of every sequence), twice the TP (every weight and activation split further), each where
    the GPUs, layers and heads divide; megatron-core's and verl's own checks judge the result."""
    if phase not in TRAINED:
        return []
    m, w = s.model, s.world_size
    tp, pp, cp = (cfg.get(f"{MEG}.{k}_parallel_size") for k in ("tensor_model", "pipeline_model", "context"))
    vpp = cfg.get(f"{MEG}.virtual_pipeline_model_parallel_size")
    out = []
    if w % (tp * 2 * pp * cp) == 0 and m.num_hidden_layers % (2 * pp) == 0:
        cost = "a deeper pipeline: more bubble ((PP−1)/(Mμ+PP−1)), more point-to-point sends; halves DP"
        key = f"{MEG}.pipeline_model_parallel_size"
        out.append(Candidate(key, [{key: 2 * pp}], cost, COMMUNICATION))
    if pp > 1 and not vpp and m.num_hidden_layers % (pp * 2) == 0:
        cost = "interleaved 1F1B: a smaller bubble, more sends; the micro-batch count must divide by PP"
        key = f"{MEG}.virtual_pipeline_model_parallel_size"
        out.append(Candidate(key, [{key: 2}], cost, COMMUNICATION))
    if w % (tp * pp * cp * 2) == 0:
        cost = "context parallel: K/V exchanged around the CP ring in every attention layer; halves DP"
        key = f"{MEG}.context_parallel_size"
        out.append(Candidate(key, [{key: 2 * cp}], cost, COMMUNICATION))
    if w % (tp * 2 * pp * cp) == 0 and m.num_attention_heads % (2 * tp) == 0 and m.num_key_value_heads % (2 * tp) == 0:
        cost = "tensor parallel: two more collectives per layer over a larger group; halves DP"
        key = f"{MEG}.tensor_model_parallel_size"
        out.append(Candidate(key, [{key: 2 * tp}], cost, COMMUNICATION))
    return out


def megatron_recompute_and_offload(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """Full recompute of every layer (the update), and Megatron's parameter and optimizer offload."""
    out = []
    tc = f"{MEG}.override_transformer_config"
    if phase.startswith("update") and cfg.get(f"{tc}.recompute_granularity") != "full":
        tries = [
            {
                f"{tc}.recompute_granularity": "full",
                f"{tc}.recompute_method": "uniform",
                f"{tc}.recompute_num_layers": 1,
            }
        ]
        out.append(
            Candidate(f"{tc}.recompute_granularity", tries, "one more forward per layer in backward; same gradient")
        )
    if not cfg.get(f"{MEG}.param_offload"):
        cost = "params cross PCIe; same math"
        out.append(Candidate(f"{MEG}.param_offload", [{f"{MEG}.param_offload": True}], cost, COMMUNICATION))
    if not cfg.get(f"{MEG}.optimizer_offload"):
        cost = "fp32 main params and Adam cross PCIe once a step; same math"
        out.append(Candidate(f"{MEG}.optimizer_offload", [{f"{MEG}.optimizer_offload": True}], cost, COMMUNICATION))
    return out
