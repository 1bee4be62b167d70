"""Fix candidates for the Megatron backend's findings (E1/E2 under Megatron, M1-M25): the nearest parallel sizes
that divide what megatron-core divides, the micro sizes that give whole groups of G, or the switch that turns a
refused feature off. ``labkit.validate.fixes.candidates`` asks here first; each candidate is re-checked on the whole
config there, so a candidate only has to be plausible.
"""

from __future__ import annotations

from typing import Any

from labkit.validate.snapshot import RF, A, Finding, R, Snap

Change = dict[str, Any]
MG = f"{A}.megatron"
TC = f"{MG}.override_transformer_config"


def _divs(x: int) -> list[int]:
    return [d for d in range(1, x + 1) if x % d == 0] if 0 < x <= 1 << 16 else []


def _nearest(values: list[int], around: int, k: int = 2) -> list[int]:
    return sorted((v for v in values if v != around), key=lambda v: (abs(v - around), v))[:k]


def _sizes_fix(s: Snap, ok: Any, key: str, current: int, limit: int) -> list[Change]:
    """The values of one size key nearest ``current`` (1..limit) for which ``ok(value)`` holds."""
    return [{f"{MG}.{key}": v} for v in _nearest([v for v in range(1, limit + 1) if ok(v)], current)]


def _shrink(W: int, tp: int, pp: int, cp: int) -> Change:
    """TP, then PP, then CP cut to the largest sizes at most their current ones whose product divides W."""
    t = max(d for d in _divs(W) if d <= tp)
    p = max(d for d in _divs(W // t) if d <= pp)
    c = max(d for d in _divs(W // (t * p)) if d <= cp)
    keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
    return {f"{MG}.{k}": v for k, v, old in zip(keys, (t, p, c), (tp, pp, cp), strict=True) if v != old}


def megatron_candidates(f: Finding, s: Snap, role_micro: dict[str, str]) -> list[Change] | None:
    """Changes worth trying for a Megatron finding (None: not a Megatron code; the FSDP candidates apply)."""
    lay, W, code = s.geo.parallel, s.world_size, f.code
    tp, pp, cp, ep, vpp = lay.tp, lay.pp, lay.cp, lay.ep, lay.vpp
    if code in ("E2", "M7"):
        return (
            _sizes_fix(s, lambda v: W % (v * pp * cp) == 0, "tensor_model_parallel_size", tp, W)
            + _sizes_fix(s, lambda v: W % (tp * v * cp) == 0, "pipeline_model_parallel_size", pp, W)
            + _sizes_fix(s, lambda v: W % (tp * pp * v) == 0, "context_parallel_size", cp, W)
            + [_shrink(W, tp, pp, cp)]
            + [{"trainer.n_gpus_per_node": g} for g in _nearest(
                [g for g in range(1, 4 * s.n_gpus_per_node + tp * pp * cp) if g * s.nnodes % (tp * pp * cp) == 0],
                s.n_gpus_per_node, 1)]
        )  # fmt: skip
    if code in ("M1", "E1"):
        D = max(1, lay.dp_size)
        mini = s.ppo_mini_batch_size * s.rollout_n // D if D else 0
        micros = _nearest([d for d in _divs(mini) if s.train_batch_size * s.rollout_n % (D * d) == 0], 8, 3)
        return [{f"{A}.ppo_micro_batch_size_per_gpu": m} for m in micros] + [{f"{A}.use_dynamic_bsz": True}]
    simple = {
        "M2": [{f"{MG}.max_seqlen_per_dp_cp_rank": s.width}, {f"{MG}.dynamic_context_parallel": False}],
        "M4": [{"actor_rollout_ref.model.use_remove_padding": True}, {f"{MG}.dynamic_context_parallel": False}],
        "M5": [{f"{MG}.virtual_pipeline_model_parallel_size": None}, {f"{MG}.dynamic_context_parallel": False}],
        "M6": [{f"{MG}.dynamic_context_parallel": False}],
        "M8": [{f"{MG}.virtual_pipeline_model_parallel_size": None}, {f"{MG}.pipeline_model_parallel_size": 2}],
        "M13": [{f"{MG}.expert_model_parallel_size": 1}],
        "M14": [
            {f"{TC}.recompute_granularity": None},
            {
                f"{TC}.recompute_granularity": "full",
                f"{TC}.recompute_method": "uniform",
                f"{TC}.recompute_num_layers": 1,
            },
            {f"{TC}.recompute_granularity": "selective", f"{TC}.recompute_num_layers": None},
        ],
        "M15": [{f"{TC}.recompute_modules": ["core_attn"]}, {f"{TC}.recompute_granularity": None}],
    }
    if code in simple:
        return simple[code]
    if code == "M9":
        etp = tp if lay.etp is None else lay.etp
        return _sizes_fix(s, lambda v: W % (etp * v * pp) == 0, "expert_model_parallel_size", ep, W) + _sizes_fix(
            s, lambda v: W % (v * ep * pp) == 0, "expert_tensor_parallel_size", etp, W
        )
    if code in ("M11", "M12", "M16"):

        def tp_ok(v: int) -> bool:
            heads_ok = s.heads is None or s.heads % v == 0
            g = s.kv_heads if s.kv_heads is not None else s.heads
            kv_ok = g is None or g % v == 0 or v % g == 0
            return W % (v * pp * cp) == 0 and heads_ok and kv_ok and (s.vocab_size is None or s.vocab_size % v == 0)

        return _sizes_fix(s, tp_ok, "tensor_model_parallel_size", tp, W)
    if code in ("M17", "M18") and s.num_layers:
        out = _sizes_fix(s, lambda v: s.num_layers % v == 0 and W % (tp * v * cp) == 0, "pipeline_model_parallel_size",
                         pp, W)  # fmt: skip
        per = s.num_layers // pp if s.num_layers % pp == 0 else 0
        if code == "M18":
            out = [{f"{MG}.virtual_pipeline_model_parallel_size": v} for v in _nearest(_divs(per)[1:], vpp or 1)] + [
                {f"{MG}.virtual_pipeline_model_parallel_size": None}
            ]
        return out
    if code == "M19" and s.num_experts:
        return _sizes_fix(s, lambda v: s.num_experts % v == 0 and W % ((lay.etp or tp) * v * pp) == 0,
                          "expert_model_parallel_size", ep, W)  # fmt: skip
    if code in ("M21", "M22", "M23"):
        key = role_micro.get(f._role)
        out: list[Change] = [{f"{MG}.virtual_pipeline_model_parallel_size": None}]
        out.append({f"{TC}.microbatch_group_size_per_vp_stage": None})
        if key:  # smaller micro-batches: more of them per pass
            current = s.cfg.get(key)
            out += [{key: m} for m in (1, 2, 4, 8) if m != current]
        return out + [{f"{A}.use_dynamic_bsz": True, f"{R}.log_prob_use_dynamic_bsz": True}]
    if code == "M25":
        sec = R if f._role == "rollout" else RF
        return [
            {f"{sec}.log_prob_micro_batch_size_per_gpu": v, f"{sec}.log_prob_micro_batch_size": None} for v in (4, 8)
        ]
    return None
