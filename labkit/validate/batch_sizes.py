"""The normalised batch sizes the planner and the reports need, per profile and engine, never raising: a role's DP
size, its per-rank mini-batch (legacy M' = (M x n) // D; engine (M x n) / D), the rows each rank holds at step 1 and
the normalisation as the reports write it. Each takes a config or a resolved run (``labkit.rules.run``).
"""

from __future__ import annotations

from labkit.config.verl_config import VerlConfig
from labkit.rules.geometry import legacy_normalized_mini
from labkit.rules.run import Run as ResolvedRun
from labkit.rules.run import as_run


def _sp(cfg: VerlConfig | ResolvedRun, role: str) -> int:
    """Ulysses size a role's DP mesh uses (the engine's critic engine always uses 1)."""
    if role == "critic":
        return cfg.get("critic.ulysses_sequence_parallel_size") if cfg.profile == "legacy" else 1
    key = "actor_rollout_ref.ref" if role == "ref" else "actor_rollout_ref.actor"
    return cfg.get(f"{key}.ulysses_sequence_parallel_size")


def dp_size(cfg: VerlConfig | ResolvedRun, role: str = "actor") -> int:
    """DP size of a role: W // sp (the engine's critic ignores critic.ulysses_sequence_parallel_size); under Megatron
    the trainer-facing DP of the actor's layout, which every colocated role runs with (0 when it does not divide)."""
    layout = as_run(cfg).layout
    if layout.is_megatron:
        return layout.trainer_dp_size
    return cfg.n_gpus // _sp(cfg, role)


def normalized_mini(cfg: VerlConfig | ResolvedRun, role: str = "actor") -> int | None:
    """Per-rank mini-batch rows: legacy M' = (M x n) // (W // sp); engine (M x n) / D, None if not divisible."""
    M = cfg.get("critic.ppo_mini_batch_size" if role == "critic" else "actor_rollout_ref.actor.ppo_mini_batch_size")
    Mn, D = M * cfg.get("actor_rollout_ref.rollout.n"), dp_size(cfg, role)
    if D == 0:
        return None
    if cfg.profile == "legacy" and cfg.get("actor_rollout_ref.actor.strategy") == "megatron":
        return Mn // D  # megatron_workers.py: *= n, //= DP, no assert
    if cfg.profile == "legacy":
        return legacy_normalized_mini(M, cfg.get("actor_rollout_ref.rollout.n"), cfg.n_gpus, _sp(cfg, role))
    return Mn // D if Mn % D == 0 else None


def rows_per_rank(cfg: VerlConfig | ResolvedRun, role: str = "actor") -> int | None:
    """Rows each DP rank holds at step 1: B x n / D (None when not divisible: verl fails at dispatch)."""
    run = as_run(cfg)
    N, D = run.geometry.samples, dp_size(run, role)
    return N // D if D and N % D == 0 else None


def mini_batch_arithmetic(cfg: VerlConfig | ResolvedRun, role: str = "actor") -> str:
    """The normalisation as the reports write it, e.g. "M' = (60 x 12) // (6 // 1) = 120"."""
    M = cfg.get("critic.ppo_mini_batch_size" if role == "critic" else "actor_rollout_ref.actor.ppo_mini_batch_size")
    n, W, sp = cfg.get("actor_rollout_ref.rollout.n"), cfg.n_gpus, _sp(cfg, role)
    layout = as_run(cfg).layout
    if layout.is_megatron:
        sp = layout.dp_divisor  # TP x PP x CP (dynamic CP: the trainer sees DP = 1)
    mini = normalized_mini(cfg, role)
    if cfg.profile == "legacy":
        return f"M' = ({M} x {n}) // ({W} // {sp}) = {mini}"
    shown = mini if mini is not None else f"{M * n}/{W // sp} (not whole)"
    return f"mini per rank = ({M} x {n}) / ({W} // {sp}) = {shown}"
