"""The rollout engine a config asks for, as engine arguments: verl's rollout keys → vLLM's ``LLM(...)`` and
``SamplingParams``, and what each key becomes on the machine that runs it (a ``labkit.plan.engine_plan.EnginePlan``).
Pure arithmetic: no vLLM import.

verl 0.9.1 builds its engine from the rollout keys in verl/workers/rollout/vllm_rollout/vllm_async_server.py:
vLLMHttpServer.launch_server (engine arguments, ``seed = replica_rank + rollout.seed``), _validate_configs
(``max_model_len`` None → the model's max_position_embeddings) and generate (``max_tokens``, ``logprobs``); its
hybrid engine up to 0.5 (verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py: vLLMRollout) ran the same ``LLM`` with
``distributed_executor_backend="external_launcher"`` inside the trainer ranks, one engine per rollout TP group, which
is how labkit runs it. The driver repeats each prompt n times (``n=1`` per request), as both profiles do.

On a CPU, vLLM reads ``gpu_memory_utilization`` as a share of the node's RAM and every rank would claim it: labkit
gives each rank ``gpu_memory_utilization × RAM / ranks on the machine`` minus its weights, and allocates no more KV cache
than the engine can use (``max_num_seqs`` sequences of ``max_model_len`` tokens); on a GPU vLLM sizes it itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from labkit.plan.engine_plan import EnginePlan

ENGINES = ("vllm", "hf")
CPU_BLOCK_SIZE = 128  # vLLM's CPU block size when none is given (vllm/platforms/cpu.py: check_and_update_config)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_R = "actor_rollout_ref.rollout"


@dataclass(frozen=True)
class EngineModel:
    """The sizes of the model the engine serves, as its config.json gives them."""

    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    hidden_size: int
    head_dim: int
    max_position_embeddings: int
    params: int  # unique parameters (a tied LM head counted once)

    @classmethod
    def from_config(cls, c: dict[str, Any], params: int | None = None) -> EngineModel:
        """From config.json values; ``params`` defaults to the Qwen2/Llama count (q/k/v biases, gated MLP, tied
        or untied LM head)."""
        h, heads, kv = (
            c["hidden_size"],
            c["num_attention_heads"],
            c.get("num_key_value_heads", c["num_attention_heads"]),
        )
        hd = c.get("head_dim") or h // heads
        if params is None:
            layer = h * heads * hd * 2 + 2 * h * kv * hd + heads * hd + 2 * kv * hd + 3 * h * c["intermediate_size"]
            head = 0 if c.get("tie_word_embeddings", False) else c["vocab_size"] * h
            params = c["vocab_size"] * h + head + c["num_hidden_layers"] * (layer + 2 * h) + h
        return cls(c["num_hidden_layers"], heads, kv, h, hd, c["max_position_embeddings"], int(params))


@dataclass(frozen=True)
class Host:
    """The machine the ranks run on: its device kind, the memory they share, the CPUs they may run on."""

    device: str  # "cpu" or "cuda"
    memory_bytes: int  # CPU: the node's RAM (MemTotal); cuda: one GPU's memory
    cpus: tuple[int, ...]  # the CPU ids this process may run on (sched_getaffinity)
    ranks: int  # rank processes sharing that memory (CPU: every rank of the group)


def kv_bytes_per_token(m: EngineModel, tp: int, dtype: str) -> int:
    """K and V of one token in one rank: 2 · layers · ⌈kv heads / tp⌉ · head_dim · dtype bytes (vLLM replicates KV
    heads when tp exceeds them)."""
    return 2 * m.num_hidden_layers * math.ceil(m.num_key_value_heads / tp) * m.head_dim * DTYPE_BYTES[dtype]


def max_model_len_of(value: int | None, m: EngineModel) -> int:
    """rollout.max_model_len, or the model's max_position_embeddings when unset (0.9.1's _validate_configs)."""
    if value is None:
        return m.max_position_embeddings
    if value > m.max_position_embeddings:
        raise ValueError(
            f"max_model_len ({value}) should be less than or equal to max_position_embeddings "
            f"({m.max_position_embeddings})"
        )
    return int(value)


def plan_engine(cfg: Any, model: EngineModel, host: Host) -> EnginePlan:
    """The engine of ``cfg`` (a VerlConfig) for ``model`` on ``host``."""
    g = cfg.get
    tp = g(f"{_R}.tensor_model_parallel_size")
    dtype = g(f"{_R}.dtype")
    max_len = max_model_len_of(g(f"{_R}.max_model_len"), model)
    prompt, response = g(f"{_R}.prompt_length"), g(f"{_R}.response_length")
    if prompt + response > max_len:
        raise ValueError(
            f"rollout prompt_length + response_length = {prompt} + {response} exceeds max_model_len {max_len}"
        )
    chunked, batched = g(f"{_R}.enable_chunked_prefill"), g(f"{_R}.max_num_batched_tokens")
    notes: list[str] = []
    if not chunked and batched < max_len:  # 0.9.1 _validate_configs raises it (with a warning)
        notes.append(f"max_num_batched_tokens raised from {batched} to max_model_len {max_len} (no chunked prefill)")
        batched = max_len
    seqs, util = g(f"{_R}.max_num_seqs"), g(f"{_R}.gpu_memory_utilization")
    per_token = kv_bytes_per_token(model, tp, dtype)
    weights = math.ceil(model.params / tp) * DTYPE_BYTES[dtype]
    ranks = host.ranks if host.device == "cpu" else 1
    budget_bytes = max(int(util * host.memory_bytes / ranks) - weights, 0)
    budget_tokens = budget_bytes // per_token
    need_tokens = seqs * max_len
    if host.device == "cuda":
        kv_bytes, kv_tokens = None, budget_tokens
    else:
        kv_tokens = min(budget_tokens, need_tokens) // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE  # whole blocks
        kv_bytes = kv_tokens * per_token
        notes.append(f"RAM shared by {ranks} ranks: each takes gpu_memory_utilization × RAM / {ranks} − its weights")
    sleep = bool(g(f"{_R}.free_cache_engine")) and host.device == "cuda"
    replicas = max(cfg.n_gpus // (tp * g(f"{_R}.pipeline_model_parallel_size")), 1)
    binding = tuple(host.cpus[r % len(host.cpus)] for r in range(host.ranks)) if host.device == "cpu" else ()
    return EnginePlan(
        name=g(f"{_R}.name"),
        device=host.device,
        tp=tp,
        replicas=replicas,
        dtype=dtype,
        max_model_len=max_len,
        prompt_length=prompt,
        response_length=response,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=g(f"{_R}.enable_prefix_caching"),
        enforce_eager=g(f"{_R}.enforce_eager"),
        gpu_memory_utilization=util,
        free_cache_engine=g(f"{_R}.free_cache_engine"),
        sleep_mode=sleep,
        logprobs_mode=g(f"{_R}.logprobs_mode"),
        calculate_log_probs=g(f"{_R}.calculate_log_probs"),
        ignore_eos=g(f"{_R}.ignore_eos"),
        seed=g(f"{_R}.seed"),
        kv_bytes_per_token=per_token,
        weights_bytes_per_rank=weights,
        kv_cache_bytes=kv_bytes,
        kv_cache_tokens=kv_tokens,
        kv_budget_tokens=budget_tokens,
        model_params=model.params,
        cpu_binding=binding,
        notes=tuple(notes),
    )


def check_fits(p: EnginePlan) -> None:
    """The engine must hold one sequence of max_model_len tokens (vLLM refuses to start otherwise)."""
    if p.kv_cache_tokens < p.max_model_len:
        raise ValueError(
            f"the rollout engine's KV cache holds {p.kv_cache_tokens} tokens per rank, less than one sequence of "
            f"max_model_len {p.max_model_len}: raise rollout.gpu_memory_utilization or rollout TP, or lower "
            "rollout.max_model_len"
        )


def max_tokens_for(prompt_tokens: int, prompt_length: int, response_length: int, max_model_len: int) -> int:
    """New tokens a request may generate: min(response_length, prompt_length + response_length − prompt), within
    [1, max_model_len − prompt]. Mirrors vllm_async_server.py: vLLMHttpServer.generate (0.9.1)."""
    room = max_model_len - prompt_tokens
    if room < 1:
        raise ValueError(
            f"Prompt length ({prompt_tokens}) leaves no room to generate within the model's maximum context length "
            f"({max_model_len}); need at least 1 token of headroom."
        )
    return max(1, min(response_length, prompt_length + response_length - prompt_tokens, room))


def sampling_kwargs(
    do_sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    max_tokens: int,
    calculate_log_probs: bool,
    *,
    ignore_eos: bool = False,
    seed: int | None = None,
    stop_token_ids: list[int] | None = None,
    min_tokens: int = 0,
) -> dict[str, Any]:
    """``SamplingParams`` of one request from verl's sampling keys: greedy is temperature 0 with top_p 1, top_k −1
    and min_p 0 (vllm_rollout_spmd.py: generate_sequences, do_sample=False); ``logprobs=0`` returns the sampled
    token's log-prob only (vllm_async_server.py: generate); n=1 (the driver repeats the prompts); ``min_tokens``: no
    EOS before that many tokens (labkit's benchmarks: every row full length, as HF's ``min_new_tokens``)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature} (use do_sample=False)")
    kw: dict[str, Any] = dict(
        n=1,
        max_tokens=int(max_tokens),
        temperature=float(temperature) if do_sample else 0.0,
        top_p=float(top_p) if do_sample else 1.0,
        top_k=int(top_k) if do_sample else -1,
        min_p=0.0,
        logprobs=0 if calculate_log_probs else None,
        ignore_eos=bool(ignore_eos),
        detokenize=False,
    )
    if seed is not None and do_sample:
        kw["seed"] = int(seed)
    if stop_token_ids:
        kw["stop_token_ids"] = [int(t) for t in stop_token_ids]
    if min_tokens:
        kw["min_tokens"] = min(int(min_tokens), int(max_tokens))  # stop tokens (EOS) masked until then
    return kw
