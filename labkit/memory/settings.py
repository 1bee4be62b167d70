"""What the memory model reads from a config: every knob that moves a byte on a GPU, once, with its verl key.

``MemorySettings.from_config(cfg, model, gpu_bytes)`` resolves the keys (per profile) into plain numbers; the phase
arithmetic (``labkit.memory.phases``) never touches the config again, so a fix ("what if param_offload=True?") is a
``dataclasses.replace`` of these settings, not a new plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.config.keys import ACTOR, MODEL, REF, ROLLOUT
from labkit.config.versions import OLD
from labkit.memory.lora import LoraSpec
from labkit.memory.model_catalogue import model_shape
from labkit.memory.settings_keys import actor_lora, compile_key, critic_fsdp, dtype_bytes, flag, release_memory
from labkit.memory.shapes import ModelShape
from labkit.rules.parallel_layout import MEGATRON, engine_of


@dataclass(frozen=True)
class MemorySettings:
    """The per-GPU memory knobs of one config (verl's names; the key each comes from is in its docstring)."""

    model: ModelShape
    """The decoder's shapes (``--model``; ``labkit.memory.shapes``)."""
    gpu_bytes: int
    """C, the capacity of one GPU (``--gpu-memory`` or a GPU of ``data/gpus.json``)."""
    profile: str
    """``legacy`` | ``engine``."""
    world_size: int
    """W = trainer.n_gpus_per_node × trainer.nnodes."""
    fsdp_size: int
    """F, the FSDP shard group: actor.fsdp_config.fsdp_size, −1 meaning all W GPUs."""
    actor_sp: int
    """actor.ulysses_sequence_parallel_size."""
    critic_sp: int
    """critic.ulysses_sequence_parallel_size."""
    rollout_tp: int
    """rollout.tensor_model_parallel_size: the engine's weights and KV heads are split over it."""
    rollout_dp: int = 1
    """rollout.data_parallel_size: vLLM splits a MoE's routed experts over TP·DP (EP, or fused_moe's TP·DP split);
    the rest of the model is replicated over DP."""
    compute_bytes: int = 2
    """b, bytes of the compute dtype: FSDP mixed_precision.param_dtype bf16 (2); 4 for the fp32 tiny model on CPU."""
    master_bytes: int = 4
    """Bytes of the actor's sharded parameter, and so of its gradient and each Adam state (torch makes them like the
    parameter): actor.fsdp_config.model_dtype, fp32 by default (verl trains in fp32 masters)."""
    critic_master_bytes: int = 4
    """The same for the critic: critic (model.)fsdp(_config).model_dtype, fp32 by default."""
    ref_offloaded: bool = True
    """verl builds the reference as a forward-only FSDP module under CPUOffload(offload_params=True) (FSDP1) or
    CPUOffloadPolicy (FSDP2): its parameters live on the CPU and each unit is copied in for its all-gather
    (``fsdp_workers.py: _build_model_optimizer`` from 0.2; ``engine/fsdp/transformer_impl.py`` for forward_only
    engines). False: resident on the GPU (labkit's CPU ranks; verl 0.1)."""
    entropy_always: bool = False
    """verl up to 0.3: every actor forward computes the full-vocabulary entropy (old log-prob, the reference's
    log-prob, the update whatever entropy_coeff; ``labkit.config.versions.ReleaseMemory``)."""
    ce_inplace_backward: bool = True
    """flash-attn's cross-entropy writes its gradient into the logits (0.4 on); before, a gradient of its own."""
    vllm_share_of_free: bool = False
    """vLLM 0.6.3 in verl 0.1/0.2: the KV pool is u × the memory free after the models loaded, at start-up."""
    actor_in_generate: bool = False
    """verl 0.1 to 0.3: the actor's parameters stay on the GPU through generation, param_offload or not."""
    lora: LoraSpec | None = None
    """The actor's LoRA adapters (``model.lora_rank`` > 0, or 0.9.1's ``model.lora.rank``): base frozen, adapters
    train, the reference is the actor with adapters off (``labkit.memory.lora``)."""
    ref_bytes: int = 4
    """Bytes of a resident reference parameter: ref.fsdp_config.model_dtype (fp32 in verl's YAML since 0.5; a
    forward-only model without it loads in bf16)."""
    rollout_bytes: int = 2
    """Bytes of an engine weight and KV entry: rollout.dtype bfloat16."""
    gpu_memory_utilization: float = 0.5
    """u, rollout.gpu_memory_utilization: the share of C the engine claims (weights + activations + KV pool)."""
    free_cache_engine: bool = True
    """rollout.free_cache_engine: the engine sleeps after generate, its share is free for training."""
    max_num_seqs: int = 256
    """rollout.max_num_seqs: sequences the engine schedules at once (legacy default 1024)."""
    max_num_batched_tokens: int = 8192
    """rollout.max_num_batched_tokens: tokens of the engine's profiling forward."""
    max_model_len: int = 1024
    """rollout.prompt_length + rollout.response_length: the longest sequence the KV pool must hold."""
    param_offload: bool = False
    """actor.fsdp_config.param_offload: actor params on CPU outside old_log_prob and update_actor."""
    optimizer_offload: bool = False
    """actor.fsdp_config.optimizer_offload: Adam states on CPU outside update_actor."""
    offload_policy: bool = False
    """actor.fsdp_config.offload_policy: FSDP2 CPUOffloadPolicy, params, grads and Adam always on CPU."""
    ref_param_offload: bool = False
    """ref.fsdp_config.param_offload: reference params on CPU outside ref_log_prob."""
    critic_param_offload: bool = False
    """critic (model.)fsdp(_config).param_offload."""
    critic_optimizer_offload: bool = False
    """critic (model.)fsdp(_config).optimizer_offload."""
    gradient_checkpointing: bool = True
    """model.enable_gradient_checkpointing: only each layer's input is kept for backward."""
    critic_gradient_checkpointing: bool = True
    """critic.model.enable_gradient_checkpointing."""
    activation_offload: bool = False
    """model.enable_activation_offload: the checkpointed layer inputs wait on CPU."""
    entropy_chunking: bool = False
    """actor.entropy_from_logits_with_chunking: entropy temporaries for chunk rows at a time."""
    entropy_chunk_size: int = 2048
    """actor.entropy_from_logits_chunk_size."""
    remove_padding: bool = True
    """The actor's use_remove_padding (model. in the engine profile, actor. in legacy): False feeds padded rows."""
    response_length: int = 0
    """rollout.response_length: the positions legacy's padded head slices out of each row's logits."""
    fused_kernels: bool = False
    """model.use_fused_kernels: log-probs from hidden states in 512-token chunks, no full logits."""
    update_entropy: bool = False
    """actor.calculate_entropy or actor.entropy_coeff ≠ 0: the update computes the entropy too."""
    logprob_kernel: str = "flash_attn"
    """verl's ``logprobs_from_logits``: ``flash_attn`` (flash-attn installed, verl's GPU images: its Triton
    cross-entropy, no T×V temporaries, the gradient written into the logits); ``torch`` (no flash_attn:
    ``logprobs_from_logits_v2``, a log-softmax per token row, each row's fp32 result saved under grad);
    ``full_log_softmax``: an fp32 upcast and a full log-softmax (labkit's CPU head, the H200 anchor's 2 + 4 + 4
    bytes a logit)."""
    autocast: bool = True
    """verl runs the actor's forward under ``torch.autocast(bfloat16)`` on GPUs: softmax, log-softmax and their
    products run in fp32 there; labkit's CPU ranks (and their measurements) run without it."""
    entropy_checkpointing: bool = False
    """actor.entropy_checkpointing: the entropy runs under torch.utils.checkpoint (its fp32 tensors are recomputed
    in backward instead of saved; the logits are kept for it)."""
    temperature: float = 1.0
    """rollout.temperature, by which the actor divides its logits: legacy in place, the engine into a copy (none at
    1) while the model's output still holds the logits."""
    attention: str = "flash_attention_2"
    """The attention kernel: ``flash_attention_2`` (verl on GPUs: varlen, no mask) or ``sdpa`` (a dense mask)."""
    fsdp: bool = True
    """The models are FSDP-wrapped (verl); False for a plain module (the CPU check): no gathered copies."""
    gathered_layers: int = 2
    """Decoder layers FSDP holds unsharded at once: 2 on a GPU (the next one prefetched), 1 on a CPU."""
    need_ref: bool = False
    """A reference policy exists (KL loss or in-reward KL): ref params and the ref_log_prob phase."""
    need_critic: bool = False
    """A critic exists (GAE): critic params, values and update_critic."""
    entropy_compiled: bool = True
    """``compile_key``: actor.use_torch_compile (legacy) or actor.fsdp_config.use_torch_compile (engine), verl's
    default true: the entropy runs as ``torch.compile(entropy_from_logits)``,
    costed as inductor's ideal fusion (a lower bound: real inductor cannot be traced); false: eager under bf16
    autocast: at ``logsumexp`` the fp32 softmax, the fp32 copy of the logits and logsumexp's own ``(x - max)``
    temporary (12 bytes a logit beyond the logits, traced by ``labkit.model.memory_trace``)."""
    image_tokens_per_sample: int = 256
    """VL models only, an assumption (sequence lengths cannot say it): image tokens in each sample's prompt (a
    448×448 image in Qwen2.5-VL: (448/14)² patches merged 2×2 = 256). The vision tower sees
    ``spatial_merge_size²`` patches per image token (``labkit.memory.vision``); the phases state the figure."""
    rollout_name: str = "vllm"
    """rollout.name: vllm (gpu_memory_utilization is the engine's whole share) or sglang (its mem_fraction_static:
    weights + KV pool, activations and CUDA graphs on top); hf and trtllm are priced as vllm, and said so."""
    cuda_context_bytes: int = 0
    """What the CUDA context and module images take of C (``labkit.memory.headroom``; 0: not counted)."""
    cublas_workspace_bytes: int = 0
    """torch's cuBLAS workspace per handle, allocated through the caching allocator but invisible to a fake trace."""
    nccl_bytes: int = 0
    """NCCL communicator buffers: 2 · NCCL_BUFFSIZE · channels per communicator (0 on one GPU)."""
    reserve_fraction: float = 0.0
    """The caching allocator's reserved-but-unallocated share of the allocated peak (fragmentation)."""
    margin_bytes: int = 0
    """A phase with less than this left of C is ``tight``, not ``fits`` (``--margin``)."""
    capacity_basis: str = "as given"
    """Where C comes from: ``as reported`` (nvidia-smi's total on record), ``nominal`` (the vendor's size: no total
    on record) or ``as given`` (``--gpu-memory``)."""

    @property
    def prompt_length(self) -> int:
        """rollout.prompt_length (data.max_prompt_length): the room a sample's image tokens share with its text."""
        return self.max_model_len - self.response_length

    @property
    def entropy_mode(self) -> str:
        """How the actor's entropy runs: ``fused`` (inside use_fused_kernels' head), ``compiled`` (torch.compile
        wraps the chunked and the checkpointed forms too), ``checkpointed``, ``chunked`` or ``eager``."""
        if self.fused_kernels:
            return "fused"
        if not self.remove_padding:  # both profiles' padded heads call the plain entropy_from_logits
            return "checkpointed" if self.entropy_checkpointing else "eager"
        if self.entropy_compiled:
            return "compiled"
        if self.entropy_checkpointing:
            return "checkpointed"
        if self.entropy_chunking:
            return "chunked"
        return "eager"

    @property
    def temperature_copy(self) -> bool:
        """The engine divides the logits by a temperature ≠ 1 into a second T×V tensor."""
        return self.profile == "engine" and self.temperature != 1.0

    @property
    def fsdp_world(self) -> int:
        """F: the GPUs one parameter is sharded over."""
        return self.world_size if self.fsdp_size in (-1, None) or self.fsdp_size <= 0 else self.fsdp_size

    @classmethod
    def from_config(cls, cfg: Any, model: str | ModelShape, gpu_bytes: int, **over: Any) -> MemorySettings:
        """Read every memory knob of ``cfg`` (a ``VerlConfig``); ``over`` replaces fields (e.g. compute_bytes=4)."""
        g = cfg.get
        shape = model if isinstance(model, ModelShape) else model_shape(model)
        old_release = cfg.release is not None and cfg.release.version in OLD
        critic = critic_fsdp(cfg.profile)
        fsdp = engine_of(cfg) != MEGATRON  # Megatron recomputes and offloads by its own keys, never these
        values = dict(
            model=shape,
            gpu_bytes=int(gpu_bytes),
            profile=cfg.profile,
            world_size=cfg.n_gpus,
            fsdp_size=g(f"{ACTOR}.fsdp_config.fsdp_size"),
            actor_sp=g(f"{ACTOR}.ulysses_sequence_parallel_size"),
            critic_sp=g("critic.ulysses_sequence_parallel_size"),
            rollout_tp=g(f"{ROLLOUT}.tensor_model_parallel_size"),
            rollout_dp=g(f"{ROLLOUT}.data_parallel_size"),
            gpu_memory_utilization=g(f"{ROLLOUT}.gpu_memory_utilization"),
            rollout_name="sglang" if g(f"{ROLLOUT}.name") == "sglang_async" else g(f"{ROLLOUT}.name"),
            free_cache_engine=g(f"{ROLLOUT}.free_cache_engine"),
            max_num_seqs=g(f"{ROLLOUT}.max_num_seqs"),
            max_num_batched_tokens=g(f"{ROLLOUT}.max_num_batched_tokens"),
            max_model_len=g(f"{ROLLOUT}.prompt_length") + g(f"{ROLLOUT}.response_length"),
            response_length=g(f"{ROLLOUT}.response_length"),
            param_offload=g(f"{ACTOR}.fsdp_config.param_offload"),
            optimizer_offload=g(f"{ACTOR}.fsdp_config.optimizer_offload"),
            offload_policy=g(f"{ACTOR}.fsdp_config.offload_policy"),
            ref_param_offload=g(f"{REF}.fsdp_config.param_offload"),
            critic_param_offload=g(f"{critic}.param_offload"),
            critic_optimizer_offload=g(f"{critic}.optimizer_offload"),
            gradient_checkpointing=fsdp and g(f"{MODEL}.enable_gradient_checkpointing"),
            critic_gradient_checkpointing=fsdp and g("critic.model.enable_gradient_checkpointing"),
            activation_offload=fsdp and g(f"{MODEL}.enable_activation_offload"),
            entropy_chunking=g(f"{ACTOR}.entropy_from_logits_with_chunking"),
            entropy_chunk_size=g(f"{ACTOR}.entropy_from_logits_chunk_size"),
            remove_padding=bool(g(f"{MODEL if cfg.profile == 'engine' else ACTOR}.use_remove_padding")),
            fused_kernels=g(f"{MODEL}.use_fused_kernels"),
            update_entropy=bool(
                g(f"{ACTOR}.calculate_entropy")
                or g(f"{ACTOR}.entropy_coeff") != 0
                or (cfg.release is not None and cfg.release.memory.entropy_always)
            ),
            entropy_compiled=flag(cfg, compile_key(cfg.profile), True),
            entropy_checkpointing=bool(g(f"{ACTOR}.entropy_checkpointing")),
            temperature=float(g(f"{ROLLOUT}.temperature")),
            master_bytes=dtype_bytes(cfg, f"{ACTOR}.fsdp_config.model_dtype", 4),
            critic_master_bytes=dtype_bytes(cfg, f"{critic}.model_dtype", 4),
            # a forward-only model without model_dtype loads in bf16 (the YAML sets fp32 from 0.5)
            ref_bytes=dtype_bytes(cfg, f"{REF}.fsdp_config.model_dtype", 2 if old_release else 4),
            **release_memory(cfg),
            lora=actor_lora(cfg, shape),
            compute_bytes=dtype_bytes(cfg, f"{ACTOR}.fsdp_config.mixed_precision.param_dtype", 2),
            need_ref=cfg.need_reference_policy,
            need_critic=cfg.need_critic,
        )
        values.update(over)
        return cls(**values)
