"""Rollout on a worker group: the RolloutWorker (one of the two engines of ``labkit.rl.engines``, vLLM by default,
inside each rollout rank) and the driver-side helpers; what a rank knows before it loads anything, and the checks
the driver runs first, are ``labkit.rl.rollout_setup``.

The driver attaches a uid per prompt, repeats the batch n times interleaved and dispatches it; each rollout DP group
(TP group of ``tensor_model_parallel_size`` ranks sharing one engine: a vLLM engine in external-launcher mode, or
labkit's TP-sharded HF model) generates its chunk and returns verl's keys, prompt left-padded to ``prompt_length``,
response right-padded to ``response_length`` (and, from vLLM, ``rollout_log_probs``).
Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker._build_rollout / generate_sequences (v0.6-0.7 nd
dispatch) and, as a selectable variant, the <=v0.5 DP_COMPUTE_PROTO + TP all-gather.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import numpy as np
import torch

from labkit.plan.engine_plan import EnginePlan
from labkit.protocol.data_proto import DataProto
from labkit.rl.hf_engine import HFEngine, generation_kwargs, load_rollout_model, load_tokenizer  # noqa: F401
from labkit.rl.rollout_output import OUTPUT_KEYS, postprocess, response_mask_from_eos  # noqa: F401
from labkit.rl.rollout_setup import (
    DEFAULT_PROMPT_LENGTH,
    DEFAULT_RESPONSE_LENGTH,
    RolloutChecks,
    _model_config_for_checks,
    default_engine_plan,
    model_folder,
)
from labkit.rl.vllm_engine import ROW_KEY
from labkit.runtime import dist, meshes
from labkit.runtime.dispatch import make_nd_compute_dataproto_dispatch_fn
from labkit.runtime.worker import Dispatch, Execute, Worker, register

METHODS = {"mesh": "generate_sequences", "all_gather": "generate_sequences_all_gather"}


class RolloutWorker(RolloutChecks, Worker):
    """One rank of the rollout: rollout mesh (dp, infer_tp, infer_pp) and its share of one engine (``name``:
    ``vllm`` with the engine plan ``engine``, a ``labkit.plan.engine_plan.EnginePlan`` as a dict, or ``hf``).

    Registers mesh "rollout" with verl's is_collect (infer_tp rank 0) and the TP group as "infer_tp" for the
    all-gather variant. (verl's own ``hf`` rollout made every rank its own dp rank; labkit shards for real.)"""

    def __init__(
        self,
        tp: int = 1,
        rdp: int = 1,
        pp: int = 1,
        prompt_length: int = DEFAULT_PROMPT_LENGTH,
        response_length: int = DEFAULT_RESPONSE_LENGTH,
        model_path: str | None = None,
        dtype: str = "float32",
        sync_logits: bool = True,
        name: str = "vllm",
        engine: dict | None = None,
    ) -> None:
        super().__init__()
        self.tp, self.rdp, self.pp = tp, rdp, pp
        self.prompt_length, self.response_length = prompt_length, response_length
        self.model_path, self.dtype, self.sync_logits = model_path, dtype, sync_logits
        self.name, self.engine_plan = name, engine
        self.engine: Any = None

    @property
    def model(self) -> Any:
        """The HF engine's model (None for vLLM, whose weights live inside the engine)."""
        return getattr(self.engine, "model", None)

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Build the rollout mesh, register dispatch info, then start this rank's share of the engine."""
        torch.set_num_threads(1)
        mesh = meshes.rollout_mesh(self.tp, self.rdp, self.pp)
        self.dp_rank, self.tp_rank = meshes.dp_rank(mesh), meshes.tp_rank(mesh)
        pp_rank = mesh.get_local_rank("infer_pp")
        self.tp_group = mesh.get_group("infer_tp")
        self._register_dispatch_collect_info(
            "rollout", dp_rank=self.dp_rank, is_collect=self.tp_rank == 0 and pp_rank == 0, tp_rank=self.tp_rank
        )
        self.register_group("infer_tp", self.tp_group, "tp_rank", "rollout")
        self.engine = self._make_engine()
        info = self.engine.start()
        if self.name == "hf":
            seen = set(dist.all_gather_object((info["weights"], info["digest"])))
            if len(seen) > 1:  # e.g. the weights folder changed while ranks were loading: TP shards would not fit
                raise RuntimeError(f"rank {self.rank}: ranks loaded different weights: {sorted(seen)}")
        else:
            info["weights"] = model_folder(self.model_path)
        return {
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "tp_rank": self.tp_rank,
            "tp_group": meshes.group_ranks(self.tp_group),
            **info,
        }

    def _make_engine(self) -> Any:
        if self.name == "hf":
            return HFEngine(self.model_path, self.dtype, self.tp, self.tp_group, self.dp_rank, self.sync_logits)
        from labkit.rl.vllm_engine import VllmEngine

        plan = (
            EnginePlan(**self.engine_plan)
            if self.engine_plan is not None
            else default_engine_plan(self.world_size, self.tp, self.prompt_length, self.response_length, self.dtype)
        )
        tied = bool(getattr(_model_config_for_checks(self.model_path), "tie_word_embeddings", False))
        return VllmEngine(plan, model_folder(self.model_path), self.rank, self.dp_rank, self.tp_group, tied)

    @register(make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout"))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """v0.6-0.7: every TP rank of a dp group gets the same chunk; the driver keeps tp_rank 0's output."""
        return self._generate(prompts)

    @register(Dispatch.DP_COMPUTE_PROTO, all_gather_group="infer_tp")
    def generate_sequences_all_gather(self, prompts: DataProto) -> DataProto:
        """<=v0.5: B·n/W rows per rank, all-gathered in the TP group before generate, output sliced back."""
        return self._generate(prompts)

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def model_info(self) -> dict[str, Any]:
        """The rank-0 model's config (for the notebook's captions) and the engine that runs it."""
        return {"config": vars(_model_config_for_checks(self.model_path)), "engine": self.name}

    def shutdown(self) -> dict[str, Any] | None:
        """The engine's shutdown (called by the rank's host before its process group goes)."""
        return self.engine.shutdown() if self.engine is not None else None

    def _generate(self, prompts: DataProto) -> DataProto:
        if self.engine is None:
            raise RuntimeError("RolloutWorker.generate_sequences called before init_model()")
        meta = prompts.meta_info
        cfg = _model_config_for_checks(self.model_path)
        if "eos_token_id" not in meta:
            meta["eos_token_id"] = cfg.eos_token_id
        if "pad_token_id" not in meta:
            meta["pad_token_id"] = (
                cfg.pad_token_id if getattr(cfg, "pad_token_id", None) is not None else cfg.eos_token_id
            )
        response_length = int(meta.get("response_length", self.response_length))
        ids = prompts.batch["input_ids"]
        if ids.shape[1] > self.prompt_length:
            raise ValueError(f"prompt width {ids.shape[1]} exceeds rollout.prompt_length {self.prompt_length}")
        if ids.shape[1] + response_length > cfg.max_position_embeddings:
            raise ValueError(
                f"prompt width {ids.shape[1]} + response_length {response_length} exceeds "
                f"max_position_embeddings {cfg.max_position_embeddings}"
            )
        tensors, engine_metrics = self.engine.generate(prompts, response_length)
        metrics = {
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "tp_rank": self.tp_rank,
            "rows": len(prompts),
            "engine": self.engine.name,
            **engine_metrics,
        }
        non_tensors = {k: v for k, v in prompts.non_tensor_batch.items() if k != ROW_KEY}
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={"metrics": [metrics]})


# ---- driver side --------------------------------------------------------------------------------------------------
def make_gen_batch(B: int, seed: int, prompt_length: int = DEFAULT_PROMPT_LENGTH, tokenizer: Any = None) -> DataProto:
    """B task prompts left-padded to ``prompt_length``, with a uid per prompt (uuid4 text, drawn from ``seed``).

    Mirrors the dataloader batch of verl/trainer/ppo/ray_trainer.py: RayPPOTrainer.fit (uid attached before repeat)."""
    from labkit.model.tiny_model import make_prompts

    if not isinstance(B, int) or B < 1:
        raise ValueError(f"B (prompts per batch) must be a positive int, got {B!r}")
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
    p = make_prompts(B, seed, tokenizer)
    longest = max(len(x) for x in p["input_ids"])
    if longest > prompt_length:
        raise ValueError(f"a prompt has {longest} tokens, more than rollout.prompt_length {prompt_length}")
    ids = torch.full((B, prompt_length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((B, prompt_length), dtype=torch.long)
    for i, x in enumerate(p["input_ids"]):
        ids[i, prompt_length - len(x) :] = torch.tensor(x)
        mask[i, prompt_length - len(x) :] = 1
    rng = random.Random(seed)
    uids = np.array([str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(B)], dtype=object)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
        non_tensors={
            "uid": uids,
            "raw_prompt": np.array(p["texts"], dtype=object),
            "reference": np.array(p["answers"], dtype=object),
        },
        meta_info={"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id},
    )


def repeat_for_rollout(batch: DataProto, n: int) -> DataProto:
    """``batch.repeat(n, interleave=True)``: the n samples of a prompt adjacent (a,a,…,b,b,…), uid repeated too.

    Mirrors RayPPOTrainer.fit: gen_batch.repeat(repeat_times=rollout.n, interleave=True)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"rollout.n must be a positive int, got {n!r}")
    return batch.repeat(repeat_times=n, interleave=True)


def prepare_generation(
    batch: DataProto,
    n: int = 1,
    *,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    response_length: int | None = None,
    seed: int = 0,
    ignore_eos: bool = False,
) -> DataProto:
    """The generation batch: ``batch`` repeated n times (interleaved) with the sampling settings in meta_info."""
    gen = repeat_for_rollout(batch, n)
    gen.non_tensor_batch[ROW_KEY] = np.arange(len(gen))  # each row's sampling seed (vLLM), whatever the layout
    gen.meta_info = dict(
        batch.meta_info,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        ignore_eos=ignore_eos,
    )
    if response_length is not None:
        gen.meta_info["response_length"] = response_length
    return gen


def generate(
    wg: Any, batch: DataProto, n: int = 1, *, dispatch: str = "mesh", stage: str = "generate", **settings: Any
) -> DataProto:
    """Repeat ``batch`` n times (interleaved), dispatch it to the group's rollout and collect; the live trace records
    the call under ``stage``. ``dispatch``: "mesh" (v0.6-0.7 nd dispatch) or "all_gather" (<=v0.5 variant);
    ``settings``: do_sample, temperature, top_k, top_p, response_length, seed, ignore_eos."""
    if dispatch not in METHODS:
        raise ValueError(f"dispatch must be one of {list(METHODS)}, got {dispatch!r}")
    return wg.call(METHODS[dispatch], prepare_generation(batch, n, **settings), _stage=stage)


def reference_generate(
    batch: DataProto,
    n: int = 1,
    *,
    model_path: str | None = None,
    weights: dict[str, Any] | None = None,
    **settings: Any,
) -> DataProto:
    """HF generate on the whole model in this process (TP=1, one replica, no worker group): the tokens every layout
    must reproduce under greedy decoding (and, for sampling, those of the HF engine's rollout replica 0).
    ``weights``: full parameters to load first (e.g. the actor's after an update: ``wg.full_params()[0]``)."""
    worker = RolloutWorker(
        prompt_length=batch.batch["input_ids"].shape[1],
        model_path=model_path,
        response_length=settings.get("response_length") or DEFAULT_RESPONSE_LENGTH,
        name="hf",
    )
    worker.engine = HFEngine(model_path, "float32", 1, None, 0)
    worker.engine.start()
    if weights is not None:
        full = {k: torch.as_tensor(v) for k, v in weights.items()}
        worker.engine.update_weights(full)
    worker.rank = worker.dp_rank = worker.tp_rank = 0
    return worker._generate(prepare_generation(batch, n, **settings))
