"""The actor's arithmetic, per profile, with no communication: settings, mini-batch normalisation and splitting,
micro-batch partitions, the global loss denominators, verl's input errors and metric aggregation.

Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker.__init__ (legacy normalisation, E20–E22),
verl/workers/actor/dp_actor.py: update_policy / compute_log_prob (legacy), verl/workers/engine_workers.py:
TrainingWorker.train_mini_batch and verl/workers/engine/utils.py: prepare_micro_batches (engine, E28–E30), and
verl/utils/metric/utils.py (reduce_metrics, Metric.aggregate_dp).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from labkit.balance.micro_batches import static_micro_batches
from labkit.config.keys import ARR
from labkit.rules import geometry, mini_batches
from labkit.rules.catalogue import message
from labkit.rules.failures import StageFailure


@dataclass(frozen=True)
class ActorSettings:
    """The verl keys the actor and the reference read, flattened (verl names; `ref_*` = actor_rollout_ref.ref.*).

    Model keys: `model_config` (kwargs of a random-init Qwen2Config, seeded by `seed`) or `model_path` (weights);
    `param_dtype` "float32" or "bfloat16" (FSDP2 mixed precision: bf16 compute, fp32 master weights and reduce)."""

    profile: str = "engine"
    rollout_n: int = 1
    ppo_mini_batch_size: int = 1
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    ppo_epochs: int = 1
    shuffle: bool = False
    data_loader_seed: int = 42
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: int | None = None
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    entropy_coeff: float = 0.0
    calculate_entropy: bool = False
    use_kl_loss: bool = False
    kl_loss_type: str = "low_var_kl"
    kl_loss_coef: float = 0.001
    grad_clip: float = 1.0
    ulysses_sequence_parallel_size: int = 1
    use_remove_padding: bool = True
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool | None = None  # None: follows use_dynamic_bsz (verl's interpolation)
    log_prob_max_token_len_per_gpu: int | None = None  # None: follows ppo_max_token_len_per_gpu
    ref_log_prob_micro_batch_size_per_gpu: int | None = None
    ref_log_prob_use_dynamic_bsz: bool | None = None
    ref_log_prob_max_token_len_per_gpu: int | None = None
    optim: str = "adamw"  # verl: AdamW; "sgd" makes an update equal to -lr × gradient (for invariance tests)
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    param_dtype: str = "float32"
    model_path: str | None = None
    model_config: dict | None = None
    seed: int = 0
    chunked_logprob: bool = True
    measure_memory: bool = False  # each data call's allocator peak (labkit.model.allocation_meter), a few times slower
    extra: dict = field(default_factory=dict)

    def with_(self, **changes: Any) -> ActorSettings:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"unknown actor settings {sorted(unknown)}")
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


def _betas(value: Any) -> tuple[float, float]:
    if not (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in value)
    ):
        raise ValueError(f"actor_rollout_ref.actor.optim.betas must be a list of two numbers, got {value!r}")
    return float(value[0]), float(value[1])


def settings_from_config(cfg: Any, **model: Any) -> ActorSettings:
    """ActorSettings from a ``labkit.config.verl_config.VerlConfig`` (profile and every verl key above, the learning rate from
    ``actor_rollout_ref.actor.optim.lr``; optim.betas, a list labkit does not model, from ``cfg.ignored``), plus
    model kwargs. ``data_loader_seed`` seeds the engine's mini-batch shuffle (ray_trainer._update_actor)."""
    g = cfg.get
    a, r, f = f"{ARR}.actor", f"{ARR}.rollout", f"{ARR}.ref"
    return ActorSettings(
        profile=cfg.profile,
        rollout_n=g(f"{r}.n"),
        ppo_mini_batch_size=g(f"{a}.ppo_mini_batch_size"),
        ppo_micro_batch_size_per_gpu=g(f"{a}.ppo_micro_batch_size_per_gpu"),
        use_dynamic_bsz=g(f"{a}.use_dynamic_bsz"),
        ppo_max_token_len_per_gpu=g(f"{a}.ppo_max_token_len_per_gpu"),
        ppo_epochs=g(f"{a}.ppo_epochs"),
        shuffle=g(f"{a}.shuffle"),
        data_loader_seed=g(f"{a}.data_loader_seed"),
        calculate_entropy=g(f"{a}.calculate_entropy"),
        weight_decay=g(f"{a}.optim.weight_decay"),
        betas=_betas(cfg.ignored.get(f"{a}.optim.betas", (0.9, 0.999))),
        loss_agg_mode=g(f"{a}.loss_agg_mode"),
        loss_scale_factor=g(f"{a}.loss_scale_factor"),
        clip_ratio=g(f"{a}.clip_ratio"),
        clip_ratio_low=g(f"{a}.clip_ratio_low"),
        clip_ratio_high=g(f"{a}.clip_ratio_high"),
        clip_ratio_c=g(f"{a}.clip_ratio_c"),
        entropy_coeff=g(f"{a}.entropy_coeff"),
        use_kl_loss=g(f"{a}.use_kl_loss"),
        kl_loss_type=g(f"{a}.kl_loss_type"),
        kl_loss_coef=g(f"{a}.kl_loss_coef"),
        grad_clip=g(f"{a}.grad_clip"),
        ulysses_sequence_parallel_size=g(f"{a}.ulysses_sequence_parallel_size"),
        use_remove_padding=bool(g(f"{a}.use_remove_padding")),
        log_prob_micro_batch_size_per_gpu=g(f"{r}.log_prob_micro_batch_size_per_gpu"),
        log_prob_use_dynamic_bsz=g(f"{r}.log_prob_use_dynamic_bsz"),
        log_prob_max_token_len_per_gpu=g(f"{r}.log_prob_max_token_len_per_gpu"),
        ref_log_prob_micro_batch_size_per_gpu=g(f"{f}.log_prob_micro_batch_size_per_gpu"),
        ref_log_prob_use_dynamic_bsz=g(f"{f}.log_prob_use_dynamic_bsz"),
        ref_log_prob_max_token_len_per_gpu=g(f"{f}.log_prob_max_token_len_per_gpu"),
        lr=g(f"{a}.optim.lr"),
        **model,
    )


# ---- which micro-batching each stage uses (the planner's ``labkit.plan.roles``) -------------------------------------------------------
@dataclass(frozen=True)
class MicroParams:
    """How one stage cuts its rows: dynamic flag, rows per micro-batch, token budget per GPU (before × sp)."""

    dynamic: bool
    micro: int | None
    budget: int


def log_prob_params(s: ActorSettings, which: str) -> MicroParams:
    """old ("actor") or ref log-prob micro-batching. Legacy reads rollout.* / ref.*; the engine's old log-prob
    follows actor.use_dynamic_bsz (0.9.1 asserts they agree). Mirrors fsdp_workers.compute_log_prob/_ref_log_prob."""
    if which not in ("actor", "ref"):
        raise ValueError(f"which must be 'actor' or 'ref', got {which!r}")
    pre = "" if which == "actor" else "ref_"
    dyn = getattr(s, f"{pre}log_prob_use_dynamic_bsz")
    dyn = s.use_dynamic_bsz if dyn is None or (which == "actor" and s.profile == "engine") else dyn
    budget = getattr(s, f"{pre}log_prob_max_token_len_per_gpu") or s.ppo_max_token_len_per_gpu
    micro = getattr(s, f"{pre}log_prob_micro_batch_size_per_gpu")
    if not dyn and micro is None:
        section = f"{ARR}.rollout" if which == "actor" else f"{ARR}.ref"
        raise ValueError(
            f"[{section}] Please set at least one of '{section}.log_prob_micro_batch_size' or "
            f"'{section}.log_prob_micro_batch_size_per_gpu'."
        )
    return MicroParams(bool(dyn), micro, int(budget))


def update_params(s: ActorSettings) -> MicroParams:
    """update_policy micro-batching (E7 when static without a micro size). Mirrors ActorConfig.__post_init__."""
    if not s.use_dynamic_bsz and s.ppo_micro_batch_size_per_gpu is None:
        raise AssertionError(
            "[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
            "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled."
        )
    return MicroParams(bool(s.use_dynamic_bsz), s.ppo_micro_batch_size_per_gpu, int(s.ppo_max_token_len_per_gpu))


# ---- mini-batches ---------------------------------------------------------------------------------------------------
def legacy_normalized_mini(M: int, n: int, world_size: int, sp: int, micro: int | None) -> int:
    """M′ = (M·n)//(W//sp) with E20, E21, E22 (checked at worker construction, even with dynamic batching)."""
    try:
        return mini_batches.legacy_mini(M, n, world_size, sp, micro)
    except StageFailure as failure:
        raise failure.as_exception() from None


def engine_mini(M: int, n: int, dp_size: int) -> int:
    """Per-rank mini = (M·n)/D with E28."""
    try:
        return mini_batches.engine_mini(M, n, dp_size)
    except StageFailure as failure:
        raise failure.as_exception() from None


def mini_batch_rows(profile: str, rows: int, mini: int) -> list[list[int]]:
    """Row indices of each mini-batch of one epoch: legacy ``split`` (ragged last allowed), engine iterator (E29)."""
    if profile == "engine" and rows % mini != 0:
        raise AssertionError(message("E29", rows=rows, mini=mini))
    return [list(range(i, min(i + mini, rows))) for i in range(0, rows, mini)]


def static_parts(profile: str, rows: int, micro: int) -> list[list[int]]:
    """Static micro-batches: legacy split(m) (ragged last), engine chunk with E30."""
    return static_micro_batches(rows, micro, profile=profile)


# ---- checks the driver can run on the whole batch before any rank starts ------------------------------------------
def check_budget(profile: str, lengths_per_dp: Sequence[Sequence[int]], width: int, budget: int) -> None:
    """E31 as verl raises it on the first offending DP rank: legacy compares the padded width, engine the longest row."""
    for lens in lengths_per_dp:
        if profile == "legacy" and budget < width:
            raise AssertionError(message("E31", budget=budget, longest=width))
        if profile == "engine" and len(lens) and budget < max(lens):
            raise AssertionError(message("E31", budget=budget, longest=f"tensor({int(max(lens))})"))


def workload(tokens: Sequence[int]) -> float:
    """Σ 24576·L + L² (verl calculate_workload), as the planner records it."""
    return float(sum(geometry.workload(int(x)) for x in tokens))


# ---- loss denominators ---------------------------------------------------------------------------------------------
def global_batch_info(
    profile: str, dp_size: int, batch_num_tokens: int, global_batch_size: int, loss_scale_factor: int | None
) -> dict[str, Any]:
    """What agg_loss receives. Engine: dp_size, all-reduced mini-batch tokens, M·n, loss_scale_factor
    (verl/workers/utils/losses.py: ppo_loss); legacy: nothing (config.global_batch_info stays {})."""
    if profile == "legacy":
        return {}
    return {
        "dp_size": dp_size,
        "batch_num_tokens": batch_num_tokens,
        "global_batch_size": global_batch_size,
        "loss_scale_factor": loss_scale_factor,
    }


# ---- metrics -------------------------------------------------------------------------------------------------------
SUM_KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss")


def reduce_legacy(per_rank: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Driver-side reduce of legacy actor metrics: lists of all DP ranks concatenated, then the mean (verl
    reduce_metrics; keys containing "max"/"min" reduce with max/min). Mirrors verl/utils/metric/utils.py."""
    merged: dict[str, list] = {}
    for metrics in per_rank:
        for k, v in metrics.items():
            merged.setdefault(k, []).extend(v if isinstance(v, list) else [v])
    out = {}
    for k, v in merged.items():
        out[k] = float(np.max(v) if "max" in k else np.min(v) if "min" in k else np.mean(v))
    return out


def reduce_engine(per_rank: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Engine metrics: per mini-batch, each key is a list over micro-batches; Metric.aggregate_dp takes the mean over
    DP ranks per micro-batch, then sums (loss keys, global denominators) or averages (others) over micro-batches;
    mini-batches are then averaged (reduce_metrics). `grad_norm`/`lr` are per mini-batch, equal on all ranks."""
    keys = per_rank[0].keys()
    out = {}
    for k in keys:
        minis = [m[k] for m in per_rank]  # rank -> [mini][micro] or [mini]
        values = []
        for j in range(len(minis[0])):
            per_mini = [r[j] for r in minis]
            if isinstance(per_mini[0], list):
                lens = {len(x) for x in per_mini}
                if len(lens) != 1:
                    raise ValueError(
                        f"All Metric instances must have the same number of values for dp aggregation: "
                        f"{[len(x) for x in per_mini]}"
                    )
                dp_mean = np.mean(np.array(per_mini, dtype=float), axis=0)
                values.append(float(np.sum(dp_mean) if k in SUM_KEYS else np.mean(dp_mean)))
            else:
                values.append(float(np.mean(per_mini)))
        out[k] = float(np.mean(values))
    return out
