"""What a live group needs for its rollout engine, from a config: the engine that runs (``rollout.name``, vLLM falling
back to HF where it is not installed), its plan on this machine (``labkit.plan.rollout_engine``), the RolloutWorker's
keyword arguments and the ranks' environment (vLLM quiet unless VLLM_LOGGING_LEVEL says otherwise).
Used by ``labkit.trainer.live_rollout`` and ``labkit.trainer.grpo_trainer``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from labkit.config.keys import ROLLOUT
from labkit.config.verl_config import VerlConfig
from labkit.plan.engine_plan import EnginePlan
from labkit.plan.rollout_engine import EngineModel, plan_engine
from labkit.rl import engines
from labkit.rules.run import as_run
from labkit.runtime.host import this_host


def model_values(model_path: str | None = None) -> dict[str, Any]:
    """config.json of the model the live group loads (the shipped tiny model unless ``model_path``)."""
    from labkit.model import tiny_model
    from labkit.rl.rollout_setup import model_folder

    path = os.path.join(model_folder(model_path), "config.json")
    return json.load(open(path)) if os.path.exists(path) else dict(tiny_model.TINY_CONFIG)


def engine_plan(cfg: VerlConfig, model_path: str | None = None) -> EnginePlan:
    """The rollout engine of ``cfg`` on this machine, for the W ranks of a live group."""
    return plan_engine(cfg, EngineModel.from_config(model_values(model_path)), this_host(cfg.n_gpus))


def rollout_kwargs(cfg: VerlConfig, model_path: str | None = None) -> dict[str, Any]:
    """The RolloutWorker's keyword arguments for ``cfg`` (the engine that will really run: see ``engines.resolve``)."""
    geo = as_run(cfg).geometry
    name = engines.resolve(cfg.get(f"{ROLLOUT}.name"))
    kw: dict[str, Any] = dict(
        tp=geo.rollout_tp,
        rdp=geo.rollout_dp,
        pp=geo.rollout_pp,
        prompt_length=geo.prompt_length,
        response_length=geo.response_length,
        model_path=model_path,
        dtype=cfg.get(f"{ROLLOUT}.dtype"),
        name=name,
    )
    if name == "vllm":
        kw["engine"] = engine_plan(cfg, model_path).as_dict()
    return kw


def rank_env(name: str) -> dict[str, str]:
    """Environment for the ranks of a group running engine ``name``: vLLM logs errors only by default."""
    if name != "vllm":
        return {}
    return {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")}
