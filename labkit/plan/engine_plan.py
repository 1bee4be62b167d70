"""What one rollout engine (one per rollout TP group) is started with, as a record: ``EnginePlan``, its keyword
arguments of ``vllm.LLM`` and the rows ``labkit plan`` prints (rollout key, value, what it became on this machine).

``llm_kwargs`` mirrors verl's hybrid engine up to 0.5 (verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:
vLLMRollout: the ``LLM`` with ``distributed_executor_backend="external_launcher"`` inside the trainer ranks) and
0.9.1's engine arguments (vllm_async_server.py: vLLMHttpServer.launch_server, ``seed = replica_rank + rollout.seed``).
``labkit.plan.rollout_engine.plan_engine`` fills it from the rollout keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class EnginePlan:
    """What one rollout engine (one per rollout TP group) is started with, and why."""

    name: str
    device: str
    tp: int
    replicas: int
    dtype: str
    max_model_len: int
    prompt_length: int
    response_length: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    enforce_eager: bool
    gpu_memory_utilization: float
    free_cache_engine: bool
    sleep_mode: bool  # vLLM's enable_sleep_mode: only where the platform supports it (not on CPU)
    logprobs_mode: str
    calculate_log_probs: bool
    ignore_eos: bool
    seed: int  # rollout.seed; replica r's engine gets seed + r
    kv_bytes_per_token: int  # per rank: 2 (K and V) · layers · kv heads per TP rank · head_dim · dtype bytes
    weights_bytes_per_rank: int
    kv_cache_bytes: int | None  # explicit KV cache per rank (CPU); None: vLLM profiles the GPU itself
    kv_cache_tokens: int  # tokens that KV cache holds per rank (GPU: an estimate)
    kv_budget_tokens: int  # what gpu_memory_utilization alone would allow
    model_params: int = 0  # the model's unique parameters (all TP ranks together)
    cpu_binding: tuple[int, ...] = ()  # rank r runs on CPU cpu_binding[r] (empty: no binding, e.g. on a GPU)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def threads_bind(self) -> str:
        """vLLM's VLLM_CPU_OMP_THREADS_BIND value for these ranks ("0|1|0|1": one entry per rank), or "nobind"."""
        return "|".join(map(str, self.cpu_binding)) if self.cpu_binding else "nobind"

    def llm_kwargs(self, model_path: str, replica: int) -> dict[str, Any]:
        """Keyword arguments of ``vllm.LLM`` for the engine of rollout replica ``replica`` (a TP group)."""
        kw: dict[str, Any] = dict(
            model=model_path,
            tensor_parallel_size=self.tp,
            distributed_executor_backend="external_launcher",
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_chunked_prefill=self.enable_chunked_prefill,
            enable_prefix_caching=self.enable_prefix_caching,
            enforce_eager=self.enforce_eager,
            enable_sleep_mode=self.sleep_mode,
            logprobs_mode=self.logprobs_mode,
            gpu_memory_utilization=self.gpu_memory_utilization,
            seed=self.seed + replica,
            skip_tokenizer_init=False,
            disable_log_stats=True,
        )
        if self.kv_cache_bytes is not None:
            kw["kv_cache_memory_bytes"] = self.kv_cache_bytes
        return kw

    def rows(self) -> list[tuple[str, str, str]]:
        """(rollout key, its value, what it became in the engine on this machine) for ``labkit plan``."""
        gib = 2**30
        if self.name == "hf":
            return [("name", "hf", f"HF generate on TP {self.tp} shards in the ranks; the vLLM keys have no effect")]
        mem = "GPU memory" if self.device == "cuda" else "RAM"
        if self.kv_cache_bytes is None:
            util = f"vLLM takes {self.gpu_memory_utilization:g} of the GPU; KV cache ≈ {self.kv_cache_tokens:,} tokens"
        else:
            capped = self.kv_cache_tokens < self.kv_budget_tokens
            util = (
                f"KV cache {self.kv_cache_bytes / 2**20:,.1f} MiB of {mem} = {self.kv_cache_tokens:,} tokens per rank "
                f"({self.kv_bytes_per_token:,} B/token)"
                + (
                    f"; capped at max_num_seqs × max_model_len (the share allows {self.kv_budget_tokens:,})"
                    if capped
                    else ""
                )
            )
        sleep = (
            "the engine sleeps after generate (enable_sleep_mode)"
            if self.sleep_mode
            else "no sleep mode on this platform: weights and KV cache stay between steps"
        )
        lens = f"{self.prompt_length} + {self.response_length}"
        return [
            ("name", self.name, f"{self.replicas} engine(s) of TP {self.tp}, external_launcher, in the ranks"),
            ("dtype", self.dtype, f"engine weights and KV cache in {self.dtype}"),
            ("gpu_memory_utilization", f"{self.gpu_memory_utilization:g}", util),
            ("max_num_seqs", str(self.max_num_seqs), "sequences scheduled at once per engine"),
            ("max_num_batched_tokens", str(self.max_num_batched_tokens), "tokens per engine step"),
            ("prompt_length + response_length", lens, f"max_model_len {self.max_model_len}; max_tokens ≤ response"),
            ("enforce_eager", str(self.enforce_eager).lower(), _eager_text(self.enforce_eager, self.device)),
            ("free_cache_engine", str(self.free_cache_engine).lower(), sleep),
            ("enable_prefix_caching", str(self.enable_prefix_caching).lower(), "reset after every weight sync"),
            ("logprobs_mode", self.logprobs_mode, "rollout_log_probs" if self.calculate_log_probs else "not returned"),
            ("seed", str(self.seed), f"engine r: seed + r; each row its own sampling seed ({self.replicas} engines)"),
            ("threads", self.threads_bind, "CPU of each rank (VLLM_CPU_OMP_THREADS_BIND)" if self.cpu_binding else "-"),
            *(("note", "", n) for n in self.notes),
            ("weights per rank", f"{self.weights_bytes_per_rank / gib:.3f} GiB", f"1/{self.tp} of the weights"),
        ]


def _eager_text(eager: bool, device: str) -> str:
    if eager:
        return "no torch.compile" + ("" if device == "cuda" else ", vLLM's sampler helpers run uncompiled too")
    return "torch.compile (inductor)" + (" + CUDA graphs" if device == "cuda" else "; slow first start on CPU")
