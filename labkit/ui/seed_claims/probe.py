"""What the claim checks ask labkit: a config of the posts' worked example under one verl version, its plan, its
``check`` report, and the first error verl would raise. Memoised, so a claim that looks at the same config twice
plans it once.

Versions are the ones labkit models (docs/profiles.md): ``≤0.5`` = the legacy workers with the old
DP_COMPUTE_PROTO + group all-gather dispatch, ``0.6–0.8`` = the legacy workers with the mesh dispatch, ``0.9.1 v0`` =
the engine workers with ``trainer.use_v1=false``, ``0.9.1 v1`` = the engine workers with the default v1 loop.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from labkit.config.keys import ARR
from labkit.config.verl_config import SEED_EXAMPLE, VerlConfig, load_config
from labkit.plan.step import plan
from labkit.rules.geometry import lengths_for_config
from labkit.trace import StepTrace
from labkit.validate.report import Report, check

OLD, LEGACY, V0, V1 = "≤0.5", "0.6–0.8", "0.9.1 v0", "0.9.1 v1"
VERSIONS = {
    OLD: ("legacy", "all_gather", ()),
    LEGACY: ("legacy", "mesh", ()),
    V0: ("engine", "mesh", ("trainer.use_v1=false",)),
    V1: ("engine", "mesh", ()),
}
SEED = tuple(SEED_EXAMPLE)
A, R, REF = f"{ARR}.actor", f"{ARR}.rollout", f"{ARR}.ref"
# the seed config with 64 prompts, n=1, 8 GPUs, TP=1, mini 30: M·n = 30 is not a multiple of the 8 GPUs
M30 = (
    "data.train_batch_size=64",
    f"{R}.n=1",
    "trainer.n_gpus_per_node=8",
    f"{R}.tensor_model_parallel_size=1",
    f"{A}.ppo_mini_batch_size=30",
    f"{A}.ppo_micro_batch_size_per_gpu=1",
    f"{R}.log_prob_micro_batch_size_per_gpu=1",
    f"{REF}.log_prob_micro_batch_size_per_gpu=1",
)
DYNAMIC = (
    f"{A}.use_dynamic_bsz=true",
    f"{R}.log_prob_use_dynamic_bsz=true",
    f"{REF}.log_prob_use_dynamic_bsz=true",
)
BUDGET = 4096  # per-GPU token budget of the dynamic variants
DYN = (*DYNAMIC, f"{A}.ppo_max_token_len_per_gpu={BUDGET}", f"{R}.log_prob_max_token_len_per_gpu={BUDGET}")
GSM = "gsm8k-like"  # the length profile the checks plan with (720 rows, seed 0)
SEED8 = [800, 6500, 1200, 4000, 9000, 2500, 1500, 7500]  # the second post's 8-sample example, on one rank
BUDGET8 = 13312  # its token budget
PROFILE = {OLD: "legacy", LEGACY: "legacy", V0: "engine", V1: "engine"}


def _check_version(version: str) -> tuple[str, str, tuple[str, ...]]:
    try:
        return VERSIONS[version]
    except KeyError:
        raise ValueError(f"version must be one of {list(VERSIONS)}, got {version!r}") from None


def config(version: str, *overrides: str, base: tuple[str, ...] = SEED) -> VerlConfig:
    """The posts' worked example (60 prompts, n=12, 6 GPUs, TP=2, mini 60, micro 8) with ``overrides``."""
    profile, _, extra = _check_version(version)
    return load_config(overrides=[*base, *extra, *overrides], profile=profile)


@lru_cache(maxsize=256)
def _trace(version: str, overrides: tuple[str, ...], lengths: Any, base: tuple[str, ...]) -> StepTrace:
    dispatch = _check_version(version)[1]
    return plan(config(version, *overrides, base=base), None if lengths is None else lengths, dispatch=dispatch)


def trace(version: str, *overrides: str, lengths: Any = None, base: tuple[str, ...] = SEED) -> StepTrace:
    """The planner's step for that config (``lengths``: a profile name or a list of token counts)."""
    key = tuple(lengths) if isinstance(lengths, (list, tuple)) else lengths
    return _trace(version, tuple(overrides), key, tuple(base))


@lru_cache(maxsize=256)
def _report(version: str, overrides: tuple[str, ...], base: tuple[str, ...]) -> Report:
    return check(config(version, *overrides, base=base), fixes=False)


def report(version: str, *overrides: str, base: tuple[str, ...] = SEED) -> Report:
    """Every check verl runs on that config (start-up, worker init, step 1), without the fix search."""
    return _report(version, tuple(overrides), tuple(base))


def first_error(version: str, *overrides: str, base: tuple[str, ...] = SEED) -> tuple[str, str, str] | None:
    """(code, when, message) of what verl raises first, or None when the config survives step 1."""
    f = report(version, *overrides, base=base).first_error
    return None if f is None else (f.code, f.when, f.message or "(bare assert)")


def error_text(version: str, *overrides: str, base: tuple[str, ...] = SEED) -> str | None:
    """What verl raises first as one line ("E28 at step 1: ..."), or None."""
    err = first_error(version, *overrides, base=base)
    return None if err is None else f"{err[0]} at {err[1]}: {err[2]}"


def startup_codes(version: str, *overrides: str, base: tuple[str, ...] = SEED) -> list[str]:
    """Codes of the errors verl raises at start-up (``validate_config`` and the config dataclasses)."""
    return [f.code for f in report(version, *overrides, base=base).errors if f.when == "start-up"]


def per_rank(tr: StepTrace, stage: str, field: str = "rows") -> list[Any]:
    """One value per DP rank (its SP rank 0) of a stage: rows, n_micro, tokens, ..."""
    recs = [r for r in tr.at(stage) if not r.sp_rank]
    return [r.n_micro if field == "n_micro" else getattr(r, field) for r in recs]


def micro_rows(tr: StepTrace, stage: str, rank: int = 0) -> list[int]:
    """Rows of each micro-batch of one rank at a stage."""
    return [m.rows for m in tr.at(stage)[rank].micro_batches]


def micro_tokens(tr: StepTrace, stage: str, rank: int = 0, field: str = "tokens") -> list[int]:
    """Tokens (or padded_tokens) of each micro-batch of one rank at a stage."""
    return [getattr(m, field) for m in tr.at(stage)[rank].micro_batches]


def lengths(version: str, spec: Any, *overrides: str, base: tuple[str, ...] = SEED) -> list[int]:
    """The B·n token counts ``trace(..., lengths=spec)`` plans with (a profile drawn with seed 0, or a list)."""
    return lengths_for_config(config(version, *overrides, base=base), spec)


def rank_lengths(version: str, spec: Any, *overrides: str, base: tuple[str, ...] = SEED) -> list[list[int]]:
    """Token counts of the rows each DP rank holds, in its order, after the planner's balance stage."""
    tr, lens = trace(version, *overrides, lengths=spec, base=base), lengths(version, spec, *overrides, base=base)
    return [[lens[i] for i in r.extra["indices"]] for r in tr.at("balance") if not r.sp_rank]
