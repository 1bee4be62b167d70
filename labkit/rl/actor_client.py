"""The driver-side client of the actor group: start it, configure it, and call compute_log_prob,
compute_ref_log_prob and update_actor with verl's input checks run on the whole batch first (E26–E31), so bad input
raises verl's error before any rank starts. Mirrors the driver's calls into ``ActorRolloutRefWorker``.
"""

from __future__ import annotations

from typing import Any

from labkit.protocol.data_proto import DataProto
from labkit.rl import actor_math as am
from labkit.rl.actor import ActorWorker
from labkit.rl.actor_model import check_settings
from labkit.rl.actor_record import attach_records, drop_call
from labkit.runtime.worker_group import WorkerGroup


def start_actor_group(world_size: int, settings: am.ActorSettings, **wg_kwargs: Any) -> Any:
    """A WorkerGroup of ActorWorkers (checks run on the driver first), with init_model done."""
    wg = WorkerGroup(ActorWorker, world_size, init_kwargs=settings.as_dict(), profile=settings.profile, **wg_kwargs)
    try:
        wg.init_model()
    except BaseException:
        wg.close()
        raise
    wg.actor_settings = settings
    return wg


def configure(wg: Any, rebuild: bool = False, **changes: Any) -> am.ActorSettings:
    """Change the actor settings on every rank (and on the driver); see ActorWorker.configure."""
    new = wg.actor_settings.with_(**changes)
    check_settings(new, wg.world_size)
    wg.configure(rebuild=rebuild, **changes)
    drop_call(wg, "configure")
    wg.actor_settings = new
    wg.trace.profile = new.profile
    return new


def _lengths_per_dp(data: DataProto, dp_size: int) -> list[list[int]]:
    lens = data.batch["attention_mask"].sum(-1).tolist()
    per = len(lens) // dp_size
    return [lens[r * per : (r + 1) * per] for r in range(dp_size)]


def precheck_log_prob(s: am.ActorSettings, data: DataProto, dp_size: int, which: str) -> None:
    """verl's errors for a log-prob call, on the driver: E26 (dispatch), E30 (engine static), E31 (dynamic)."""
    if len(data) % dp_size:
        data.chunk(dp_size)  # raises E26, verl's text
    p = am.log_prob_params(s, which)
    if p.dynamic:
        am.check_budget(
            s.profile,
            _lengths_per_dp(data, dp_size),
            data.batch["input_ids"].shape[1],
            p.budget * s.ulysses_sequence_parallel_size,
        )
    else:
        am.static_parts(s.profile, len(data) // dp_size, p.micro)


def precheck_update(s: am.ActorSettings, data: DataProto, dp_size: int, world_size: int) -> None:
    """verl's errors for update_actor, on the driver: E26, E20–E22 / E28, E29, E30, E31 on every mini-batch."""
    if len(data) % dp_size:
        data.chunk(dp_size)
    rows = len(data) // dp_size
    p = am.update_params(s)
    sp = s.ulysses_sequence_parallel_size
    if s.profile == "legacy":
        mini = am.legacy_normalized_mini(
            s.ppo_mini_batch_size, s.rollout_n, world_size, sp, s.ppo_micro_batch_size_per_gpu
        )
    else:
        mini = am.engine_mini(s.ppo_mini_batch_size, s.rollout_n, dp_size)
    per_dp = _lengths_per_dp(data, dp_size)
    for idx in am.mini_batch_rows(s.profile, rows, mini):
        if p.dynamic:
            am.check_budget(
                s.profile, [[lens[i] for i in idx] for lens in per_dp], data.batch["input_ids"].shape[1], p.budget * sp
            )
        else:
            am.static_parts(s.profile, len(idx), p.micro)


def _call(wg: Any, method: str, data: DataProto, stage: str) -> Any:
    out = wg.call(method, data, _stage=stage)
    attach_records(wg, stage, wg.take_records())
    return out


def compute_log_prob(wg: Any, data: DataProto, stage: str = "old_log_prob") -> DataProto:
    """old_log_probs (+ entropys) of every row, in input order; the live trace gets the per-rank micro-batches."""
    precheck_log_prob(wg.actor_settings, data, wg.dp_size("actor"), "actor")
    return _call(wg, "compute_log_prob", data, stage)


def compute_ref_log_prob(wg: Any, data: DataProto, stage: str = "ref_log_prob") -> DataProto:
    """ref_log_prob of every row, in input order (reference model, ref.* micro-batching keys)."""
    precheck_log_prob(wg.actor_settings, data, wg.dp_size("actor"), "ref")
    return _call(wg, "compute_ref_log_prob", data, stage)


def update_actor(wg: Any, data: DataProto, stage: str = "update_actor") -> dict[str, float]:
    """One PPO update (ppo_epochs × mini-batches optimizer steps); returns the metrics reduced as verl's driver does."""
    s = wg.actor_settings
    precheck_update(s, data, wg.dp_size("actor"), wg.world_size)
    out = _call(wg, "update_actor", data, stage)
    metrics = out.meta_info["metrics"]
    per_rank = [{k: v[i] for k, v in metrics.items()} for i in range(len(next(iter(metrics.values()))))]
    return am.reduce_legacy(per_rank) if s.profile == "legacy" else am.reduce_engine(per_rank)
