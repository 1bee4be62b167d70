"""Fix candidates per finding code: the config changes worth trying, most natural first, derived from the arithmetic
that failed (nearest divisors, nearest valid batch sizes, the deprecated key swapped for its per-GPU twin, ...). The
Megatron codes' come from ``megatron_fixes``. A candidate only has to be plausible: ``fixes.Searcher`` re-checks each
one on the whole config.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from labkit.rules.geometry import ceil_div
from labkit.validate.megatron_fixes import megatron_candidates
from labkit.validate.snapshot import RF, A, C, Finding, R, Snap

DEL = "<delete>"
_MICRO_KEYS = {  # the micro size of each role's static pass (the Megatron VPP fixes try other values)
    "actor": f"{A}.ppo_micro_batch_size_per_gpu",
    "rollout": f"{R}.log_prob_micro_batch_size_per_gpu",
    "ref": f"{RF}.log_prob_micro_batch_size_per_gpu",
}
Change = dict[str, Any]


def _divisors(x: int) -> list[int]:
    return [d for d in range(1, x + 1) if x % d == 0] if 0 < x <= 1 << 20 else []


def _near_divisors(x: int, around: int | None, k: int = 2) -> list[int]:
    """The k divisors of x nearest ``around`` (ties: the smaller first)."""
    ds = _divisors(x)
    around = around or 8
    return sorted(ds, key=lambda d: (abs(d - around), d))[:k]


NEAR_SCAN = 10_000  # values tried on each side of a size: bounds the fix search for huge configs


def _near(pred: Callable[[int], bool], start: int, lo: int = 1, hi: int | None = None) -> list[int]:
    """The nearest value below ``start`` and the nearest above it (within [lo, hi], at most NEAR_SCAN steps away)
    satisfying pred."""
    hi = hi or max(4 * start, 64)
    lo, hi = max(lo, start - NEAR_SCAN), min(hi, start + NEAR_SCAN)
    out = []
    for rng in (range(start - 1, lo - 1, -1), range(start + 1, hi + 1)):
        v = next((v for v in rng if pred(v)), None)
        if v is not None:
            out.append(v)
    return out


def _mini_ok(s: Snap, M: int, m: int | None, D: int) -> bool:
    """Whether M prompts give a valid per-rank mini-batch for the profile (and micro size m)."""
    Mn = M * s.rollout_n
    if s.legacy:
        Mp = Mn // D
        return Mp > 0 and (m is None or Mp % m == 0) and (s.samples // D) % Mp == 0
    return Mn % D == 0 and (s.samples // D) % (Mn // D) == 0 and (m is None or (Mn // D) % m == 0)


def _sp_values(s: Snap, sp: int) -> list[int]:
    """Ulysses sizes dividing W and compatible with the head counts, nearest the current one first."""
    good = [
        d
        for d in _divisors(s.world_size)
        if (s.heads is None or s.heads % d == 0) and (s.kv_heads is None or s.kv_heads % d == 0 or d % s.kv_heads == 0)
    ]
    return sorted(good, key=lambda d: (abs(d - sp), -d))[:2]


def candidates(f: Finding, s: Snap) -> list[Change]:
    """Config changes worth trying for one finding, most natural first."""
    code, role = f.code, f._role
    if s.megatron:
        mc = megatron_candidates(f, s, _MICRO_KEYS)
        if mc is not None:
            return mc
    D = max(1, s.geo.parallel.trainer_dp_size if s.megatron else s.world_size // s.ulysses_sp)
    L = math.lcm(
        s.agent_workers,
        D,
        *([s.world_size] if not s.use_dynamic_bsz or s.need_critic and not s.legacy else []),
        *([max(1, s.world_size // s.critic_ulysses_sp)] if s.need_critic and s.legacy else []),
    )
    B_fix = [{"data.train_batch_size": b} for b in _near(lambda b: b * s.rollout_n % L == 0, s.train_batch_size)]
    n_fix = [
        {f"{R}.n": v} for v in _near(lambda v: s.train_batch_size * v % L == 0, s.rollout_n, 1, 4 * s.rollout_n + 16)
    ]
    mini = (s.ppo_mini_batch_size * s.rollout_n) // D if D else 0
    cm = (s.critic_ppo_mini_batch_size * s.rollout_n) // max(
        1, s.world_size // s.critic_ulysses_sp if s.legacy else s.world_size
    )
    sp_key = {"critic": f"{C}.ulysses_sequence_parallel_size", "ref": f"{RF}.ulysses_sequence_parallel_size"}.get(
        role, f"{A}.ulysses_sequence_parallel_size"
    )
    if code == "E1":
        return (
            B_fix
            + n_fix
            + [
                {"trainer.n_gpus_per_node": g}
                for g in _near(
                    lambda g: s.train_batch_size * s.rollout_n % (g * s.nnodes) == 0,
                    s.n_gpus_per_node,
                    1,
                    4 * s.n_gpus_per_node,
                )
            ]
            + [{f"{A}.use_dynamic_bsz": True}]
        )
    if code in ("E3", "E4", "B2", "X2", "X3", "E30", "S3") and role in ("rollout", "ref"):
        sec = R if role == "rollout" else RF
        Dr = D if s.legacy or role == "rollout" else max(1, s.world_size // s.ref_ulysses_sp)
        vals = _near_divisors(s.samples // Dr, s.ppo_micro_batch_size_per_gpu or 8)
        dep = s.log_prob_micro_batch_size if role == "rollout" else s.ref_log_prob_micro_batch_size
        base: Change = {f"{sec}.log_prob_micro_batch_size": DEL} if dep is not None else {}
        out = [{**base, f"{sec}.log_prob_micro_batch_size_per_gpu": v} for v in vals]
        if code == "E4":
            out.append({f"{sec}.log_prob_micro_batch_size_per_gpu": DEL})
        if code in ("X3", "B2"):
            out.append({f"{sec}.log_prob_use_dynamic_bsz": DEL})
        return out
    if code == "B1":
        return [{f"{R}.log_prob_use_dynamic_bsz": DEL}, {f"{R}.log_prob_use_dynamic_bsz": s.use_dynamic_bsz}]
    if code == "E6" and role == "actor":
        return [{f"{A}.ppo_micro_batch_size": DEL}]
    if code in ("E6", "E7") and role == "ref":
        rows = s.samples // max(1, s.world_size // s.ref_ulysses_sp)
        return [{f"{RF}.log_prob_micro_batch_size_per_gpu": v} for v in _near_divisors(rows, 8)] + [
            {f"{RF}.log_prob_use_dynamic_bsz": DEL},
            {f"{RF}.log_prob_micro_batch_size": DEL},
        ]
    if role == "actor" and code in (
        "E7",
        "E10",
        "E11",
        "B3",
        "X1",
        "E21",
        "E20",
        "E30",
        "S2",
        "S1",
        "S4",
        "E28",
        "E29",
    ):
        out = []
        if code in ("E7", "E10", "E11", "B3", "X1", "E21", "E30", "S4") and mini:
            deprecated = {f"{A}.ppo_micro_batch_size": DEL} if s.ppo_micro_batch_size is not None else {}
            out += [
                {**deprecated, f"{A}.ppo_micro_batch_size_per_gpu": v}
                for v in _near_divisors(
                    mini,
                    s.ppo_micro_batch_size_per_gpu or (s.ppo_micro_batch_size // D if s.ppo_micro_batch_size else 8),
                )
            ]
        out += [
            {f"{A}.ppo_mini_batch_size": v}
            for v in _near(
                lambda v: _mini_ok(s, v, s.ppo_micro_batch_size_per_gpu, D),
                s.ppo_mini_batch_size,
                1,
                s.train_batch_size,
            )
        ]
        return out + ([{f"{A}.use_dynamic_bsz": True}] if code == "E7" else [])
    if role == "critic" and code in (
        "E13",
        "E14",
        "E15",
        "E17",
        "X1",
        "E21",
        "E22",
        "X2",
        "S1",
        "S2",
        "S3",
        "E28",
        "E29",
    ):
        deprecated = {f"{C}.ppo_micro_batch_size": DEL} if s.critic_ppo_micro_batch_size is not None else {}
        out = [
            {**deprecated, f"{C}.ppo_micro_batch_size_per_gpu": v}
            for v in _near_divisors(cm, s.critic_ppo_micro_batch_size_per_gpu or 8)
        ]
        Dc = max(1, s.world_size // s.critic_ulysses_sp if s.legacy else s.world_size)
        minis = _near(
            lambda v: _mini_ok(s, v, s.critic_ppo_micro_batch_size_per_gpu, Dc),
            s.critic_ppo_mini_batch_size,
            1,
            s.train_batch_size,
        )
        return out + [{f"{C}.ppo_mini_batch_size": v} for v in minis]
    simple = {
        "E8": [{f"{A}.loss_agg_mode": "token-mean"}],
        "E9": [{f"{A}.ppo_mini_batch_size": s.train_batch_size}, {"data.train_batch_size": s.ppo_mini_batch_size}],
        "E12": [{"actor_rollout_ref.model.use_remove_padding": True}, {f"{A}.ulysses_sequence_parallel_size": 1}],
        "E16": [
            {f"{C}.ppo_mini_batch_size": s.train_batch_size},
            {"data.train_batch_size": s.critic_ppo_mini_batch_size},
        ],
        "E18": [{f"{C}.model.use_remove_padding": True}, {f"{C}.ulysses_sequence_parallel_size": 1}],
        "E19": [{f"{R}.temperature": 1.0}, {f"{R}.val_kwargs.do_sample": False}],
        "E25": [{f"{R}.mode": "async"}],
        "N2": [{"data.val_batch_size": DEL}],
    }
    if code in simple:
        return simple[code]
    if code == "E23":
        rest = s.rollout_dp * s.rollout_pp
        tps = _near(lambda t: s.world_size % (t * rest) == 0, s.rollout_tp, 1, s.world_size)
        return [{f"{R}.tensor_model_parallel_size": t} for t in tps] + [
            {"trainer.n_gpus_per_node": g}
            for g in _near(lambda g: g * s.nnodes % (s.rollout_tp * rest) == 0, s.n_gpus_per_node)
        ]
    if code == "E26" and role == "rollout":
        return [{f"{R}.agent.num_workers": v} for v in _near_divisors(s.samples, s.agent_workers)] + B_fix + n_fix
    if code in ("E26", "E27", "E36", "E38"):
        return B_fix + n_fix
    if code in ("E41", "E42", "X4"):
        out = [
            {sp_key: v}
            for v in _sp_values(s, {"critic": s.critic_ulysses_sp, "ref": s.ref_ulysses_sp}.get(role, s.ulysses_sp))
        ]
        if role == "ref":  # the ref's size follows the actor's unless set
            out += [{f"{A}.ulysses_sequence_parallel_size": v} for v in _sp_values(s, s.ulysses_sp)]
        return out
    if code == "E31":
        width = s.max_seq_len if s.max_seq_len is not None and not s.legacy else s.width
        keys = {
            "rollout": (f"{R}.log_prob_max_token_len_per_gpu", s.ulysses_sp),
            "ref": (f"{RF}.log_prob_max_token_len_per_gpu", s.ref_ulysses_sp),
            "actor": (f"{A}.ppo_max_token_len_per_gpu", s.ulysses_sp),
        }
        pairs = (
            [keys[role]]
            if role in keys
            else [
                (f"{C}.forward_max_token_len_per_gpu", s.critic_ulysses_sp),
                (f"{C}.ppo_max_token_len_per_gpu", s.critic_ulysses_sp),
            ]
        )
        return [{k: ceil_div(width, sp) for k, sp in pairs}]
    return []
