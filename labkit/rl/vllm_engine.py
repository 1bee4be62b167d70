"""The ``vllm`` rollout engine as verl's hybrid engine runs it: one ``vllm.LLM`` per rollout TP group, built inside
the rollout ranks' own torch.distributed world with ``distributed_executor_backend="external_launcher"`` (each TP
rank holds 1/tp of the weights; the engine core runs in the rank's process: VLLM_ENABLE_V1_MULTIPROCESSING=0).

vLLM splits a world larger than one TP group itself: ranks [0..tp), [tp..2tp), ... are the TP groups of separate
engines ("external DP", vllm/distributed/parallel_state.py: initialize_model_parallel), which is labkit's rollout mesh
(dp, infer_tp). Every TP rank of an engine must submit the same requests in the same order (the nd dispatch gives
them the same rows). Engine arguments come from ``labkit.plan.rollout_engine``; each row gets its own sampling seed
(rollout seed, call seed, row), so a sample depends on its row, not on the layout.
Mirrors verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py: vLLMRollout (≤0.5, external_launcher) with the
0.9.1 engine arguments (vllm_async_server.py: vLLMHttpServer.launch_server).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from labkit.plan.engine_plan import EnginePlan
from labkit.plan.rollout_engine import max_tokens_for, sampling_kwargs
from labkit.protocol.data_proto import DataProto
from labkit.rl import weight_sync
from labkit.rl.rollout_output import from_token_lists
from labkit.runtime import dist, rank_files
from labkit.runtime.ray_init import without_rfc3987

ROW_KEY = "rollout_row"  # non-tensor key: each row's index in the generation batch (its sampling seed)
WORKER_CLS = "labkit.rl.vllm_worker.LabkitCPUWorker"


def cache_root() -> Path:
    """labkit's own cache folder (LABKIT_CACHE_DIR, else ~/.cache/labkit): vLLM's and inductor's caches go there."""
    return Path(os.environ.get("LABKIT_CACHE_DIR") or Path.home() / ".cache" / "labkit")


def row_seed(seed: int, row: int) -> int:
    """The sampling seed of generation-batch row ``row`` in a call seeded ``seed``."""
    return (int(seed) * 1_000_003 + int(row)) % 2**31


def rank_env(plan: EnginePlan, ident: str) -> dict[str, str]:
    """What a rank sets before importing vLLM: in-process engine core, quiet logs, caches and sockets in folders
    labkit owns, the segment names' identifier, and (eager on CPU) no torch.compile for vLLM's sampler helpers."""
    root = cache_root()
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "VLLM_RPC_BASE_PATH": rank_files.group_dir() or str(root / "rpc"),
        "LABKIT_VLLM_IDENT": ident,
        "TORCH_CPP_LOG_LEVEL": "ERROR",
    }
    if plan.enforce_eager and plan.device == "cpu":
        env["TORCH_COMPILE_DISABLE"] = "1"
    return env


def cpus_of(bind: str, rank: int) -> set[int]:
    """Rank ``rank``'s CPUs in a VLLM_CPU_OMP_THREADS_BIND value ("0|1", entries like "0-3,5"; one per rank)."""
    entries = bind.split("|")
    cpus: set[int] = set()
    for part in entries[rank % len(entries)].split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pin_to(cpus: set[int]) -> None:
    """Every thread of this process on ``cpus`` (threads started later inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass


def _quiet() -> None:
    """Only errors from vLLM and the torch warnings it triggers (users' notebooks and the CLI stay readable)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    for name in ("torch._library", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\..*")
    warnings.filterwarnings("ignore", message=r".*reduce_op.*")


def local_param_count(model: torch.nn.Module) -> int:
    """Parameters this rank's engine holds, each once (a tied LM head shares the embedding's): a weight the CPU
    backend repacked (its tensor left empty) counts as its partition's input × output size."""
    total, seen = 0, set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if p.numel() == 0 and name == "weight" and hasattr(module, "output_size_per_partition"):
                total += int(module.input_size_per_partition) * int(module.output_size_per_partition)
            else:
                total += p.numel()
    return total


def import_llm() -> Any:
    """``vllm.LLM``; the optional rfc3987_syntax module (~2 s of lark parsers, pulled in through ray/jsonschema) is
    skipped as labkit's Ray launcher does."""
    with without_rfc3987():
        from vllm import LLM
    return LLM


class VllmEngine:
    """One rank's share of a vLLM engine (its TP group's), with verl's rollout keys as engine arguments."""

    name = "vllm"

    def __init__(self, plan: EnginePlan, model_path: str, rank: int, dp_rank: int, tp_group: Any, tied: bool) -> None:
        self.plan, self.model_path, self.rank, self.dp_rank, self.tied = plan, model_path, rank, dp_rank, tied
        self.tp_group = tp_group
        self.llm: Any = None
        self.asleep = False
        self.shm_parts: list[Any] = []

    def start(self) -> dict[str, Any]:
        """Environment, thread binding, then ``LLM(...)`` (collective over the whole world: every rank builds its
        engine at once); returns what the engine really got (KV blocks, seconds)."""
        p = self.plan
        group = rank_files.group_dir()
        ident = f"lk{os.path.basename(group).removeprefix(rank_files.PREFIX)}" if group else f"lk{os.getpid()}"
        os.environ.update(rank_env(p, ident))
        if os.environ.get("TORCH_COMPILE_DISABLE") == "1":  # torch._dynamo read it at import (the fork server's)
            torch._dynamo.config.disable = True
        bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
        if p.cpu_binding and bind != "nobind":
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind = bind or p.threads_bind
            pin_to(cpus_of(bind, self.rank))
        rank_files.register(f"/dev/shm/{ident}-*")  # the TP group's CPU segments (labkit.rl.vllm_worker)
        _quiet()
        t0 = time.perf_counter()
        LLM = import_llm()
        t1 = time.perf_counter()
        kw = p.llm_kwargs(self.model_path, self.dp_rank)
        if p.device == "cpu":
            kw["worker_cls"] = WORKER_CLS
        with dist.waiting_on("vllm.LLM()"):  # every rank of the world builds its engine at once
            self.llm = LLM(**kw, use_tqdm_on_load=False)
        self.shm_parts = self._segments()
        rank_files.register(*(f"/dev/shm/{x.shared_memory.name}" for x in self.shm_parts))
        cache = self.llm.llm_engine.vllm_config.cache_config
        model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        return {
            "engine": self.name,
            "import_s": t1 - t0,
            "engine_s": time.perf_counter() - t1,
            "params_full": p.model_params,
            "params_local": local_param_count(model),
            "kv_blocks": int(cache.num_gpu_blocks or 0),
            "block_size": int(cache.block_size),
            "kv_cache_tokens": int(cache.num_gpu_blocks or 0) * int(cache.block_size),
            "cpu": sorted(os.sched_getaffinity(0)),
            "seed": kw["seed"],
        }

    def _segments(self) -> list[Any]:
        """The shared-memory parts of vLLM's TP message queue (its ring buffer and tensor arena: psm_* segments)."""
        from vllm.distributed import parallel_state as ps

        mq = getattr(getattr(ps, "_TP", None), "mq_broadcaster", None)
        parts = (getattr(mq, "buffer", None), getattr(mq, "tensor_arena", None))
        return [x for x in parts if getattr(x, "shared_memory", None) is not None]

    def generate(self, prompts: DataProto, response_length: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """verl's rollout tensors (+ ``rollout_log_probs``) for ``prompts`` and this rank's metrics."""
        p, meta = self.plan, prompts.meta_info
        eos, pad = meta["eos_token_id"], meta["pad_token_id"]
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        pos = (
            prompts.batch["position_ids"]
            if "position_ids" in prompts.batch.keys()
            else (mask.cumsum(1) - 1).clamp(min=0)
        )
        rows = prompts.non_tensor_batch.get(ROW_KEY, np.arange(len(prompts)))
        full = bool(meta.get("ignore_eos", False))  # labkit's benchmarks: EOS masked until response_length
        stop = None if p.ignore_eos else (eos if isinstance(eos, list) else [eos])  # verl's ignore_eos: no stop
        requests, params = [], []
        from vllm import SamplingParams

        for row, (x, m) in enumerate(zip(ids, mask)):
            tokens = x[m.bool()].tolist()
            requests.append({"prompt_token_ids": tokens})
            most = max_tokens_for(len(tokens), ids.shape[1], response_length, p.max_model_len)
            kw = sampling_kwargs(
                bool(meta.get("do_sample", True)),
                float(meta.get("temperature", 1.0)),
                int(meta.get("top_k", -1)),
                float(meta.get("top_p", 1.0)),
                most,
                p.calculate_log_probs,
                ignore_eos=True,  # stops come from the batch's EOS ids (stop_token_ids), as HF generate's do
                seed=row_seed(meta.get("seed", 0), rows[row]),
                stop_token_ids=stop,
                min_tokens=most if full else 0,
            )
            params.append(SamplingParams(**kw))
        if p.sleep_mode and self.asleep:
            self.llm.wake_up()
        t0 = time.perf_counter()
        with dist.waiting_on("vllm.generate (TP all-reduces)", self.tp_group):
            outs = self.llm.generate(requests, params, use_tqdm=False)
        gen_s = time.perf_counter() - t0
        if p.sleep_mode:
            self.llm.sleep(level=1)
            self.asleep = True
        toks = [list(o.outputs[0].token_ids) for o in outs]
        lps = None
        if p.calculate_log_probs:
            lps = [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in outs]
        tensors = from_token_lists(ids, mask, pos, toks, eos, pad, response_length, lps)
        metrics = {
            "gen_s": gen_s,
            "response_tokens": int(tensors["response_length"].sum()),
            "forward_steps": max((len(t) for t in toks), default=0),
        }
        return tensors, metrics

    def update_weights(self, full: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The actor's full weights into the live engine (in place), tied head and prefix cache refreshed."""
        if self.plan.sleep_mode and self.asleep:
            self.llm.wake_up(tags=["weights"])
        out = weight_sync.load_into_vllm(self.llm, full, self.plan.device, self.tied)
        if self.plan.sleep_mode and self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        return out

    def shutdown(self) -> dict[str, Any]:
        """Remove the shared memory this rank registered (the driver sweeps it again). The engine object itself is
        left to the process's end: collecting it blocks on its message queue's sockets."""
        t0 = time.perf_counter()
        for part in getattr(self, "shm_parts", []):  # the creator unlinks its segments (and tells its tracker)
            if getattr(part, "is_creator", False):
                try:
                    part.shared_memory.unlink()
                except FileNotFoundError:
                    pass
        removed = rank_files.remove_registered(own_only=True)
        return {"engine": self.name, "removed": removed, "seconds": time.perf_counter() - t0}
