"""What a rollout rank knows before it loads anything: the model's sizes from its config.json, the folder the vLLM
engine loads, the engine plan of verl's defaults, and the checks the driver runs before any process starts (E23,
heads/MLP split over TP, positions that fit, the KV cache, the weights present). Mirrors the checks of
verl/workers/fsdp_workers.py: ActorRolloutRefWorker._build_rollout.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from labkit.plan.engine_plan import EnginePlan
from labkit.plan.rollout_engine import check_fits
from labkit.runtime import meshes

DEFAULT_PROMPT_LENGTH = 24  # labkit.model.tiny_model.MAX_PROMPT_TOKENS
DEFAULT_RESPONSE_LENGTH = 32


def _model_config_for_checks(model_path: str | None) -> Any:
    """The attention/MLP sizes TP needs, read on the driver without loading weights."""
    from labkit.model import tiny_model

    cfg_file = Path(model_path or tiny_model.TINY_MODEL_DIR) / "config.json"
    values = json.loads(cfg_file.read_text()) if cfg_file.exists() else tiny_model.TINY_CONFIG
    return SimpleNamespace(**values)


def model_folder(model_path: str | None) -> str:
    """The folder the vLLM engine loads (config, tokenizer, safetensors): ``model_path`` or the shipped tiny model."""
    from labkit.model import tiny_model

    return str(model_path or tiny_model.TINY_MODEL_DIR)


def default_engine_plan(world_size: int, tp: int, prompt_length: int, response_length: int, dtype: str) -> EnginePlan:
    """The vLLM engine plan of verl's defaults for these sizes (a RolloutWorker built without one)."""
    from labkit.config.verl_config import load_config
    from labkit.plan.rollout_engine import EngineModel, plan_engine
    from labkit.runtime.host import this_host

    r = "actor_rollout_ref.rollout"
    cfg = load_config(
        overrides=[
            f"trainer.n_gpus_per_node={world_size}",
            f"{r}.tensor_model_parallel_size={tp}",
            f"data.max_prompt_length={prompt_length}",
            f"data.max_response_length={response_length}",
            f"{r}.dtype={dtype}",
            f"{r}.enforce_eager=true",
        ]
    )
    return plan_engine(cfg, EngineModel.from_config(vars(_model_config_for_checks(None))), this_host(world_size))


class RolloutChecks:
    """The driver-side ``check_world`` of ``labkit.rl.rollout.RolloutWorker``."""

    @classmethod
    def check_world(
        cls,
        world_size: int,
        tp: int = 1,
        rdp: int = 1,
        pp: int = 1,
        prompt_length: int = DEFAULT_PROMPT_LENGTH,
        response_length: int = DEFAULT_RESPONSE_LENGTH,
        model_path: str | None = None,
        name: str = "vllm",
        engine: dict | None = None,
        **_: Any,
    ) -> None:
        """Driver-side checks before any process starts: E23, heads/MLP split over TP, positions that fit, the
        engine's KV cache holds a sequence, the weights vLLM loads exist."""
        from labkit.model.tp_parallel import check_tp_split

        if rdp != 1 or pp != 1:
            raise ValueError(
                f"labkit's rollout shards by TP only: rollout.data_parallel_size={rdp} and "
                f"pipeline_model_parallel_size={pp} must be 1"
            )
        if name not in ("vllm", "hf"):
            raise ValueError(f"rollout name must be 'vllm' or 'hf', got {name!r}")
        meshes.check_rollout_mesh(world_size, tp, rdp, pp)
        cfg = _model_config_for_checks(model_path)
        check_tp_split(cfg, tp)
        if prompt_length + response_length > cfg.max_position_embeddings:
            raise ValueError(
                f"prompt_length + response_length = {prompt_length} + {response_length} exceeds the "
                f"model's max_position_embeddings {cfg.max_position_embeddings}"
            )
        if name == "vllm":
            if engine is not None:
                check_fits(EnginePlan(**engine))
            if not (Path(model_folder(model_path)) / "model.safetensors").exists():
                raise FileNotFoundError(
                    f"the vLLM engine loads {model_folder(model_path)}/model.safetensors, which is not there "
                    "(run scripts/train_tiny_model.py, or use rollout.name=hf)"
                )
