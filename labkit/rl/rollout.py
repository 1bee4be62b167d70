"""Rollout on a worker group: the RolloutWorker (HF ``generate`` on real TP shards) and the driver-side helpers.

The driver attaches a uid per prompt, repeats the batch n times interleaved and dispatches it; each rollout DP group
(TP group of ``tensor_model_parallel_size`` ranks holding one sharded copy of the model) generates its chunk and
returns verl's keys, prompt left-padded to ``prompt_length``, response right-padded to ``response_length``.
Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker._build_rollout / generate_sequences (v0.6-0.7 nd
dispatch) and, as a selectable variant, the <=v0.5 DP_COMPUTE_PROTO + TP all-gather.
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from labkit.protocol.data_proto import DataProto
from labkit.protocol.fields import ROLLOUT_OUTPUT_KEYS
from labkit.runtime import dist
from labkit.runtime.dispatch import Dispatch, Execute, Worker, make_nd_compute_dataproto_dispatch_fn, register

OUTPUT_KEYS = ROLLOUT_OUTPUT_KEYS
METHODS = {"mesh": "generate_sequences", "all_gather": "generate_sequences_all_gather"}
DEFAULT_PROMPT_LENGTH = 24  # labkit.model.tiny_model.MAX_PROMPT_TOKENS
DEFAULT_RESPONSE_LENGTH = 32


# ---- model and tokenizer (shipped weights, or a seeded random init while they are not there yet) ------------------
def load_rollout_model(model_path: str | None = None, dtype: str = "float32") -> tuple[torch.nn.Module, str]:
    """(model in eval mode, where it came from). Without ``model_path`` and without the shipped weights in
    data/tiny-qwen2, a random-init tiny Qwen2 (seed 0, identical on every rank) stands in."""
    from transformers import Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    from labkit.model import tiny_model

    hf_logging.disable_progress_bar()  # no "Loading weights" bars from every rank
    folder = Path(model_path) if model_path else tiny_model.TINY_MODEL_DIR
    if (folder / "model.safetensors").exists() or model_path:
        return tiny_model.load_tiny_model(folder, dtype=getattr(torch, dtype)), str(folder)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_model.build_config(attn_implementation="sdpa")).to(getattr(torch, dtype))
    return model.eval(), f"random init (seed 0): {folder}/model.safetensors is not there yet"


def load_tokenizer(model_path: str | None = None) -> Any:
    """The shipped tiny tokenizer, or the same recipe rebuilt in memory while data/tiny-qwen2 is not there yet."""
    from labkit.model import tiny_model

    folder = Path(model_path) if model_path else tiny_model.TINY_MODEL_DIR
    if (folder / "tokenizer.json").exists() or model_path:
        return tiny_model.load_tiny_tokenizer(folder)
    return tiny_model.build_tokenizer()


def _model_config_for_checks(model_path: str | None) -> Any:
    """The attention/MLP sizes TP needs, read on the driver without loading weights."""
    import json

    from labkit.model import tiny_model

    cfg_file = Path(model_path or tiny_model.TINY_MODEL_DIR) / "config.json"
    values = json.loads(cfg_file.read_text()) if cfg_file.exists() else tiny_model.TINY_CONFIG
    return SimpleNamespace(**values)


# ---- pure post-processing (verl's output layout) ------------------------------------------------------------------
def response_mask_from_eos(responses: torch.Tensor, eos_token_id: int | list[int]) -> torch.Tensor:
    """1 up to and including the first EOS, 0 after. Mirrors verl/utils/torch_functional.py: get_response_mask."""
    eos = torch.isin(responses, torch.as_tensor(eos_token_id, device=responses.device)).long()
    return ((eos.cumsum(dim=1) - eos) == 0).long()


def postprocess(
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_position_ids: torch.Tensor,
    sequences: torch.Tensor,
    eos_token_id: int | list[int],
    pad_token_id: int,
    response_length: int,
) -> dict[str, torch.Tensor]:
    """HF ``generate`` output -> verl's rollout tensors: response cut/right-padded to ``response_length``, tokens after
    the first EOS set to pad, masks and position ids concatenated (response positions continue from the prompt's last).
    Mirrors verl/workers/rollout/vllm_rollout (v0.6) output assembly and agent_loop._agent_loop_postprocess widths."""
    resp = sequences[:, prompts.shape[1] :][:, :response_length]
    generated = resp.shape[1]
    if generated < response_length:
        fill = resp.new_full((resp.shape[0], response_length - generated), pad_token_id)
        resp = torch.cat([resp, fill], dim=1)
    resp_mask = response_mask_from_eos(resp, eos_token_id)
    resp_mask[:, generated:] = 0  # right padding added here is never a response token, even when pad != EOS
    resp = resp.masked_fill(resp_mask == 0, pad_token_id)
    delta = torch.arange(1, response_length + 1, dtype=prompt_position_ids.dtype).unsqueeze(0)
    return {
        "prompts": prompts,
        "responses": resp,
        "response_mask": resp_mask,
        "input_ids": torch.cat([prompts, resp], dim=1),
        "attention_mask": torch.cat([prompt_mask.long(), resp_mask], dim=1),
        "position_ids": torch.cat([prompt_position_ids, prompt_position_ids[:, -1:] + delta], dim=1),
        "response_length": resp_mask.sum(dim=1),
    }


def generation_kwargs(
    do_sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    response_length: int,
    eos_token_id: int | list[int],
    pad_token_id: int,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """HF ``generate`` arguments for verl's sampling keys (top_k=-1 means off; greedy passes no warpers).

    ignore_eos (benchmarks): every row generates response_length tokens (HF min_new_tokens masks EOS until then)."""
    if response_length < 1:
        raise ValueError(f"response_length must be >= 1, got {response_length}")
    kw: dict[str, Any] = dict(
        max_new_tokens=int(response_length),
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        do_sample=bool(do_sample),
    )
    if ignore_eos:
        kw["min_new_tokens"] = int(response_length)
    if do_sample:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature} (use do_sample=False)")
        kw.update(temperature=float(temperature), top_k=max(int(top_k), 0), top_p=float(top_p))
    else:
        kw.update(temperature=None, top_k=None, top_p=None)
    return kw


class RolloutWorker(Worker):
    """One rank of the rollout: rollout mesh (dp, infer_tp, infer_pp), a TP shard of the tiny model, HF generate.

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
    ) -> None:
        super().__init__()
        self.tp, self.rdp, self.pp = tp, rdp, pp
        self.prompt_length, self.response_length = prompt_length, response_length
        self.model_path, self.dtype, self.sync_logits = model_path, dtype, sync_logits
        self.model: Any = None

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
        **_: Any,
    ) -> None:
        """Driver-side checks before any process starts: E23, heads/MLP split over TP, positions that fit."""
        from labkit.model.tp_parallel import check_tp_split

        if rdp != 1 or pp != 1:
            raise ValueError(
                f"labkit's HF rollout shards by TP only: rollout.data_parallel_size={rdp} and "
                f"pipeline_model_parallel_size={pp} must be 1"
            )
        dist.check_rollout_mesh(world_size, tp, rdp, pp)
        cfg = _model_config_for_checks(model_path)
        check_tp_split(cfg, tp)
        if prompt_length + response_length > cfg.max_position_embeddings:
            raise ValueError(
                f"prompt_length + response_length = {prompt_length} + {response_length} exceeds the "
                f"model's max_position_embeddings {cfg.max_position_embeddings}"
            )

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Build the rollout mesh, register dispatch info, load the model and shard it over this rank's TP group."""
        from labkit.model.tp_parallel import shard_model_for_tp

        torch.set_num_threads(1)
        mesh = dist.rollout_mesh(self.tp, self.rdp, self.pp)
        self.dp_rank, self.tp_rank = dist.dp_rank(mesh), dist.tp_rank(mesh)
        pp_rank = mesh.get_local_rank("infer_pp")
        self.tp_group = mesh.get_group("infer_tp")
        self._register_dispatch_collect_info(
            "rollout", dp_rank=self.dp_rank, is_collect=self.tp_rank == 0 and pp_rank == 0, tp_rank=self.tp_rank
        )
        self.register_group("infer_tp", self.tp_group, "tp_rank", "rollout")
        self.model, source = load_rollout_model(self.model_path, self.dtype)
        total = sum(p.numel() for p in self.model.parameters())
        digest = float(sum(p.detach().double().sum() for p in self.model.parameters()))
        seen = {(s, d) for s, d in dist.all_gather_object((source, digest))}
        if len(seen) > 1:  # e.g. the weights folder changed while ranks were loading: TP shards would not fit
            raise RuntimeError(f"rank {self.rank}: ranks loaded different weights: {sorted(seen)}")
        if self.tp > 1:
            shard_model_for_tp(self.model, self.tp_group)
        return {
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "tp_rank": self.tp_rank,
            "tp_group": dist.group_ranks(self.tp_group),
            "weights": source,
            "params_full": total,
            "params_local": sum(p.numel() for p in self.model.parameters()),
        }

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
        """The rank-0 model's config (for the notebook's captions)."""
        return {"config": self.model.config.to_dict() if self.model is not None else None}

    def _generate(self, prompts: DataProto) -> DataProto:
        from labkit.model.tp_communications import tp_collective_counts
        from labkit.model.tp_parallel import tp_generate

        if self.model is None:
            raise RuntimeError("RolloutWorker.generate_sequences called before init_model()")
        meta = prompts.meta_info
        cfg = self.model.config
        eos = meta.get("eos_token_id", cfg.eos_token_id)
        pad = meta.get("pad_token_id", cfg.pad_token_id if cfg.pad_token_id is not None else eos)
        response_length = int(meta.get("response_length", self.response_length))
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        if ids.shape[1] > self.prompt_length:
            raise ValueError(f"prompt width {ids.shape[1]} exceeds rollout.prompt_length {self.prompt_length}")
        if ids.shape[1] + response_length > cfg.max_position_embeddings:
            raise ValueError(
                f"prompt width {ids.shape[1]} + response_length {response_length} exceeds "
                f"max_position_embeddings {cfg.max_position_embeddings}"
            )
        pos = (
            prompts.batch["position_ids"]
            if "position_ids" in prompts.batch.keys()
            else (mask.long().cumsum(1) - 1).clamp(min=0)
        )
        kw = generation_kwargs(
            meta.get("do_sample", True),
            meta.get("temperature", 1.0),
            meta.get("top_k", -1),
            meta.get("top_p", 1.0),
            response_length,
            eos,
            pad,
            meta.get("ignore_eos", False),
        )
        # one sampling stream per rollout replica (dp group), shared by its TP ranks so they draw identical tokens
        seed = int(meta.get("seed", 0)) * 1_000_003 + self.dp_rank
        before = tp_collective_counts()
        t0 = time.perf_counter()
        seqs = tp_generate(self.model, ids, mask, kw, seed=seed, sync_logits=self.sync_logits)
        gen_s = time.perf_counter() - t0
        tp_calls = {k: v - before.get(k, 0) for k, v in tp_collective_counts().items() if v != before.get(k, 0)}
        tensors = postprocess(ids, mask, pos, seqs, eos, pad, response_length)
        metrics = {
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "tp_rank": self.tp_rank,
            "rows": len(prompts),
            "gen_s": gen_s,
            "response_tokens": int(tensors["response_length"].sum()),
            "forward_steps": int(seqs.shape[1] - ids.shape[1]),
            "tp_all_reduce": tp_calls.get("all_reduce", 0),
            "tp_broadcast": tp_calls.get("broadcast", 0),
        }
        return DataProto.from_dict(
            tensors=tensors, non_tensors=dict(prompts.non_tensor_batch), meta_info={"metrics": [metrics]}
        )


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


def reference_generate(batch: DataProto, n: int = 1, *, model_path: str | None = None, **settings: Any) -> DataProto:
    """The same rollout code on the whole model in this process (TP=1, one replica, no worker group): the tokens
    every layout must reproduce under greedy decoding (and, for sampling, those of rollout replica 0)."""
    worker = RolloutWorker(
        prompt_length=batch.batch["input_ids"].shape[1],
        model_path=model_path,
        response_length=settings.get("response_length") or DEFAULT_RESPONSE_LENGTH,
    )
    worker.model, _ = load_rollout_model(model_path)
    worker.rank = worker.dp_rank = worker.tp_rank = 0
    return worker._generate(prepare_generation(batch, n, **settings))
