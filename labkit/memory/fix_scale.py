"""The larger moves "why did it OOM?" offers when the batch knobs are not enough: a larger rollout TP, LoRA adapters
in place of a full fine-tune, Megatron's CPU optimizer and more nodes. Each is a ``Candidate`` of
``labkit.memory.fix_candidates`` priced by the same model; its tier says that it costs more than time.
"""

from __future__ import annotations

from labkit.config.keys import ACTOR, MODEL, ROLLOUT
from labkit.config.verl_config import VerlConfig
from labkit.memory.fix_candidates import COMMUNICATION, DIFFERENT_RUN, TRAINED, Candidate
from labkit.memory.lora import LoraError, layer_linears
from labkit.memory.settings import MemorySettings
from labkit.memory.shapes import ModelShape
from labkit.rules.parallel_layout import MEGATRON, engine_of

LORA_RANK = 32
"""The rank verl's LoRA guide starts from (``lora_rank=32``, ``lora_alpha=32``, all linear layers)."""


def rollout_tp(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """Twice, four and eight times the rollout TP (smallest first) where the GPUs and vLLM's head split allow it:
    the engine's weights and KV heads over more GPUs."""
    if phase != "generate":
        return []
    key, tp = f"{ROLLOUT}.tensor_model_parallel_size", s.rollout_tp
    tries = [{key: t} for t in (tp * 2, tp * 4, tp * 8) if s.world_size % t == 0 and vllm_splits(s.model, t)]
    cost = "vLLM splits its weights and KV heads over more GPUs: fewer rollout replicas, an all-reduce per layer"
    return [Candidate(key, tries, cost, COMMUNICATION)] if tries else []


def vllm_splits(m: ModelShape, tp: int) -> bool:
    """vLLM can split the model over ``tp`` GPUs: the attention heads divide by it, the KV heads divide by it or
    are replicated over it."""
    kv = m.num_key_value_heads
    return m.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def lora(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """LoRA adapters (rank 32 on every linear layer) on an actor trained in full: the base frozen in bf16, no
    full-size gradients or Adam states, the reference is the actor with adapters off. FSDP reads ``model.lora_rank``
    (PEFT), Megatron ``model.lora.rank`` (Megatron-Bridge, verl 0.9)."""
    if s.lora is not None or phase not in ("generate", *TRAINED):
        return []
    key = f"{MODEL}.lora.rank" if engine_of(cfg) == MEGATRON else f"{MODEL}.lora_rank"
    if cfg.release is not None and cfg.release.has_key(key) is False:
        return []  # the release has no LoRA
    try:
        layer_linears(s.model, 0)
    except LoraError:
        return []  # adapters on this model's mixers are not priced (MLA, linear attention, Mamba2)
    cost = (
        f"trains rank-{LORA_RANK} adapters on every linear layer instead of the whole model: a different update "
        "(verl's LoRA guide raises the learning rate about 10x); the reference is the actor with adapters off"
    )
    return [Candidate(key, [{key: LORA_RANK}], cost, DIFFERENT_RUN)]


def megatron_cpu_optimizer(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """megatron-core's CPU optimizer (``optimizer_cpu_offload`` with the smallest ``optimizer_offload_fraction``
    that fits): that share of the fp32 main params and Adam states lives and steps on the host."""
    if cfg.get(f"{ACTOR}.strategy") != "megatron":
        return []
    over = f"{ACTOR}.optim.override_optimizer_config"
    if str(cfg.raw(f"{over}.optimizer_cpu_offload", False)).lower() == "true":
        return []
    tries = [
        {f"{over}.optimizer_cpu_offload": True, f"{over}.optimizer_offload_fraction": share}
        for share in (0.25, 0.5, 0.75, 1.0)
    ]
    cost = (
        "megatron-core's hybrid CPU optimizer: that share of the fp32 main params and Adam states in host memory, "
        "Adam steps on the CPU (a slower step; verl's large-MoE recipes run it)"
    )
    return [Candidate(f"{over}.optimizer_cpu_offload", tries, cost, COMMUNICATION)]


def more_nodes(cfg: VerlConfig, s: MemorySettings, phase: str) -> list[Candidate]:
    """Two, four and eight times the nodes: every sharded state over more GPUs (the batch sizes as they are)."""
    nodes = cfg.get("trainer.nnodes")
    per_node = cfg.get("trainer.n_gpus_per_node")
    tries = [{"trainer.nnodes": nodes * k} for k in (2, 4, 8)]
    cost = f"more nodes like these ({per_node} GPUs each): sharded model states spread over more GPUs"
    return [Candidate("trainer.nnodes", tries, cost, DIFFERENT_RUN)]
