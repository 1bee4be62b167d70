"""The batching-relevant subset of verl's ``ppo_trainer.yaml``: every key labkit models, its type and default.

Defaults are verl's own (``verl/trainer/config/_generated_ppo_trainer.yaml``; identical for these keys in the
0.7.1/0.8 legacy release and 0.9.1 unless a profile override says otherwise). ``follows`` mirrors an OmegaConf
interpolation (``${oc.select:other.key,fallback}``): the key takes the other key's value unless set explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROFILES = ("legacy", "engine")

INT, FLOAT, BOOL, STR, STRLIST = "int", "float", "bool", "str", "list of str"


@dataclass(frozen=True)
class Key:
    """One config key: its type, verl default, interpolation source and allowed range."""

    path: str
    type: str
    default: Any = None
    nullable: bool = False
    follows: str | None = None
    minimum: float | None = None
    choices: tuple | None = None
    doc: str = ""
    profiles: tuple[str, ...] = PROFILES
    legacy_default: Any = "same"  # where verl 0.7.1's YAML default differs from 0.9.1's

    def default_for(self, profile: str) -> Any:
        return self.default if profile == "engine" or self.legacy_default == "same" else self.legacy_default


ARR = "actor_rollout_ref"
ACTOR, ROLLOUT, REF, MODEL = f"{ARR}.actor", f"{ARR}.rollout", f"{ARR}.ref", f"{ARR}.model"
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")

_KEYS = [
    # data
    Key("data.train_batch_size", INT, 1024, minimum=1, doc="prompts per training step (B)"),
    Key("data.gen_batch_size", INT, None, nullable=True, minimum=1, doc="prompts per generation call (defaults to B)"),
    Key("data.val_batch_size", INT, None, nullable=True, minimum=1, doc="deprecated; validation goes as one batch"),
    Key("data.max_prompt_length", INT, 512, minimum=1, doc="prompt width in tokens (left-padded)"),
    Key("data.max_response_length", INT, 512, minimum=1, doc="response width in tokens (right-padded)"),
    # trainer
    Key("trainer.n_gpus_per_node", INT, 8, minimum=1, doc="GPUs per node"),
    Key("trainer.nnodes", INT, 1, minimum=1, doc="nodes; W = n_gpus_per_node x nnodes"),
    Key("trainer.balance_batch", BOOL, True, doc="run _balance_batch (KK over DP ranks) each step"),
    Key("trainer.critic_warmup", INT, 0, minimum=0, doc="steps before the actor starts updating"),
    Key("trainer.total_epochs", INT, 30, minimum=1),
    Key("trainer.total_training_steps", INT, None, nullable=True, minimum=1),
    Key("trainer.use_legacy_worker_impl", STR, "auto", choices=("auto", "enable", "disable"), profiles=("legacy",)),
    Key(
        "trainer.use_v1",
        BOOL,
        True,
        profiles=("engine",),
        doc="0.9.1's v1 trainer loop (trainer/ppo/v1), its default; labkit models the v0 loop (RayPPOTrainer)",
    ),
    # actor
    Key(
        f"{ACTOR}.strategy",
        STR,
        "fsdp",
        choices=("fsdp", "fsdp2", "megatron", "veomni"),
        doc="the training backend: FSDP, Megatron (model_engine=megatron / ppo_megatron_trainer) or VeOmni",
    ),
    Key(f"{ACTOR}.ppo_mini_batch_size", INT, 256, minimum=1, doc="prompts per optimizer step, global (M)"),
    Key(f"{ACTOR}.ppo_micro_batch_size", INT, None, nullable=True, minimum=1, doc="deprecated global micro size"),
    Key(f"{ACTOR}.ppo_micro_batch_size_per_gpu", INT, None, nullable=True, minimum=1, doc="rows per micro-batch (m)"),
    Key(f"{ACTOR}.use_dynamic_bsz", BOOL, False, doc="token-budget micro-batches"),
    Key(f"{ACTOR}.ppo_max_token_len_per_gpu", INT, 16384, minimum=1, doc="token budget per GPU (x sp)"),
    Key(f"{ACTOR}.ppo_epochs", INT, 1, minimum=1),
    Key(f"{ACTOR}.shuffle", BOOL, False),
    Key(f"{ACTOR}.data_loader_seed", INT, 42),
    Key(f"{ACTOR}.ulysses_sequence_parallel_size", INT, 1, minimum=1, doc="Ulysses SP size (sp)"),
    Key(f"{ACTOR}.use_remove_padding", BOOL, follows=f"{MODEL}.use_remove_padding"),
    Key(f"{ACTOR}.loss_agg_mode", STR, "token-mean", doc="see verl core_algos.agg_loss"),
    Key(f"{ACTOR}.loss_scale_factor", INT, None, nullable=True, minimum=1),
    Key(f"{ACTOR}.clip_ratio", FLOAT, 0.2, minimum=0),
    Key(f"{ACTOR}.clip_ratio_low", FLOAT, 0.2, minimum=0),
    Key(f"{ACTOR}.clip_ratio_high", FLOAT, 0.2, minimum=0),
    Key(f"{ACTOR}.clip_ratio_c", FLOAT, 3.0),
    Key(f"{ACTOR}.entropy_coeff", FLOAT, 0.0),
    Key(f"{ACTOR}.use_kl_loss", BOOL, False),
    Key(f"{ACTOR}.kl_loss_coef", FLOAT, 0.001),
    Key(f"{ACTOR}.kl_loss_type", STR, "low_var_kl"),
    Key(f"{ACTOR}.grad_clip", FLOAT, 1.0),
    Key(f"{ACTOR}.calculate_entropy", BOOL, False, doc="entropy in update_policy even when entropy_coeff = 0"),
    Key(f"{ACTOR}.optim.lr", FLOAT, 1e-6, minimum=0, doc="actor learning rate"),
    Key(f"{ACTOR}.optim.weight_decay", FLOAT, 0.01, minimum=0, doc="AdamW weight decay"),
    Key(f"{ACTOR}.fsdp_config.fsdp_size", INT, -1),
    # rollout
    Key(
        f"{ROLLOUT}.name",
        STR,
        "vllm",
        choices=("vllm", "hf", "sglang", "trtllm", "sglang_async"),
        doc="the rollout engine: vllm (verl's examples; its YAML leaves it '???'), hf (HF generate on TP shards), or "
        "sglang / trtllm (planned with the same rollout mesh; live runs use vllm or hf)",
    ),
    Key(f"{ROLLOUT}.mode", STR, "async", choices=("async", "sync")),
    Key(f"{ROLLOUT}.n", INT, 1, minimum=1, doc="samples per prompt"),
    Key(f"{ROLLOUT}.temperature", FLOAT, 1.0),
    Key(f"{ROLLOUT}.top_k", INT, -1),
    Key(f"{ROLLOUT}.top_p", FLOAT, 1.0),
    Key(f"{ROLLOUT}.do_sample", BOOL, True),
    Key(f"{ROLLOUT}.prompt_length", INT, follows="data.max_prompt_length", minimum=1),
    Key(f"{ROLLOUT}.response_length", INT, follows="data.max_response_length", minimum=1),
    Key(f"{ROLLOUT}.tensor_model_parallel_size", INT, 2, minimum=1, doc="rollout TP size"),
    Key(f"{ROLLOUT}.data_parallel_size", INT, 1, minimum=1),
    Key(f"{ROLLOUT}.pipeline_model_parallel_size", INT, 1, minimum=1),
    Key(f"{ROLLOUT}.log_prob_micro_batch_size", INT, None, nullable=True, minimum=1, doc="deprecated global"),
    Key(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", INT, None, nullable=True, minimum=1),
    Key(f"{ROLLOUT}.log_prob_use_dynamic_bsz", BOOL, follows=f"{ACTOR}.use_dynamic_bsz"),
    Key(f"{ROLLOUT}.log_prob_max_token_len_per_gpu", INT, follows=f"{ACTOR}.ppo_max_token_len_per_gpu", minimum=1),
    Key(f"{ROLLOUT}.agent.num_workers", INT, 8, minimum=1, doc="agent-loop workers (A)"),
    Key(f"{ROLLOUT}.val_kwargs.do_sample", BOOL, False),
    Key(f"{ROLLOUT}.val_kwargs.n", INT, 1, minimum=1),
    Key(f"{ROLLOUT}.val_kwargs.temperature", FLOAT, 0.0),
    # ref
    Key(f"{REF}.log_prob_micro_batch_size", INT, None, nullable=True, minimum=1),
    Key(f"{REF}.log_prob_micro_batch_size_per_gpu", INT, None, nullable=True, minimum=1),
    Key(f"{REF}.log_prob_use_dynamic_bsz", BOOL, follows=f"{ACTOR}.use_dynamic_bsz"),
    Key(f"{REF}.log_prob_max_token_len_per_gpu", INT, follows=f"{ACTOR}.ppo_max_token_len_per_gpu", minimum=1),
    Key(f"{REF}.ulysses_sequence_parallel_size", INT, follows=f"{ACTOR}.ulysses_sequence_parallel_size", minimum=1),
    # model
    Key(f"{MODEL}.path", STR, "data/tiny-qwen2"),
    Key(f"{MODEL}.use_remove_padding", BOOL, True),
    Key(f"{MODEL}.enable_gradient_checkpointing", BOOL, True),
    Key(f"{MODEL}.use_fused_kernels", BOOL, False),
    Key(f"{MODEL}.lora_rank", INT, 0, minimum=0),
    # memory (labkit.memory): offload, checkpointing, entropy chunking, the rollout engine's memory pool
    Key(f"{ACTOR}.fsdp_config.param_offload", BOOL, False, doc="actor params on CPU outside its own passes"),
    Key(f"{ACTOR}.fsdp_config.optimizer_offload", BOOL, False, doc="Adam states on CPU outside the update"),
    Key(f"{ACTOR}.fsdp_config.offload_policy", BOOL, False, doc="FSDP2 CPUOffloadPolicy: params, grads, Adam on CPU"),
    Key(f"{ACTOR}.entropy_from_logits_with_chunking", BOOL, False, doc="entropy over row chunks of the logits"),
    Key(f"{ACTOR}.entropy_from_logits_chunk_size", INT, 2048, minimum=1, doc="rows per entropy chunk"),
    Key(f"{ACTOR}.entropy_checkpointing", BOOL, False, doc="recompute the entropy in backward"),
    Key(f"{REF}.fsdp_config.param_offload", BOOL, False, doc="reference params on CPU outside ref_log_prob"),
    Key(f"{REF}.entropy_from_logits_with_chunking", BOOL, False),
    Key(f"{MODEL}.enable_activation_offload", BOOL, False, doc="checkpointed layer inputs kept on CPU"),
    Key(f"{ROLLOUT}.gpu_memory_utilization", FLOAT, 0.5, minimum=0, doc="share of the GPU the rollout engine takes"),
    Key(f"{ROLLOUT}.free_cache_engine", BOOL, True, doc="the engine sleeps (frees weights + KV) after generate"),
    Key(f"{ROLLOUT}.max_num_seqs", INT, 256, minimum=1, legacy_default=1024, doc="sequences the engine runs at once"),
    Key(f"{ROLLOUT}.max_num_batched_tokens", INT, 8192, minimum=1, doc="tokens per engine step (prefill chunk)"),
    # the rollout engine (labkit.plan.rollout_engine maps these onto vLLM's LLM(...) and SamplingParams)
    Key(f"{ROLLOUT}.dtype", STR, "bfloat16", choices=("bfloat16", "float16", "float32"), doc="engine weights dtype"),
    Key(f"{ROLLOUT}.enforce_eager", BOOL, False, doc="no CUDA graphs / torch.compile in the engine"),
    Key(
        f"{ROLLOUT}.max_model_len", INT, None, nullable=True, minimum=1, doc="None: the model's max_position_embeddings"
    ),
    Key(f"{ROLLOUT}.enable_chunked_prefill", BOOL, True, doc="prefills split into max_num_batched_tokens chunks"),
    Key(f"{ROLLOUT}.enable_prefix_caching", BOOL, True, doc="KV blocks of shared prompt prefixes reused"),
    Key(
        f"{ROLLOUT}.logprobs_mode",
        STR,
        "processed_logprobs",
        choices=("processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits"),
        doc="processed: log_softmax(logits / temperature), what the trainer recomputes",
    ),
    Key(
        f"{ROLLOUT}.calculate_log_probs",
        BOOL,
        True,
        legacy_default=False,
        doc="the engine returns rollout_log_probs of the sampled tokens",
    ),
    Key(f"{ROLLOUT}.seed", INT, 42, legacy_default=0, doc="engine seed = seed + replica rank (0.7.1: no key, 0)"),
    Key(f"{ROLLOUT}.ignore_eos", BOOL, False, doc="keep generating after EOS, up to response_length"),
    Key("critic.model.enable_gradient_checkpointing", BOOL, True),
    Key("critic.model.fsdp_config.param_offload", BOOL, False, profiles=("legacy",)),
    Key("critic.model.fsdp_config.optimizer_offload", BOOL, False, profiles=("legacy",)),
    Key("critic.fsdp.param_offload", BOOL, False, profiles=("engine",)),
    Key("critic.fsdp.optimizer_offload", BOOL, False, profiles=("engine",)),
    # critic
    Key("critic.enable", BOOL, None, nullable=True, doc="None: on iff adv_estimator == gae"),
    Key("critic.strategy", STR, "fsdp", choices=("fsdp", "fsdp2", "megatron", "veomni")),
    Key(f"{REF}.strategy", STR, follows=f"{ACTOR}.strategy", choices=("fsdp", "fsdp2", "megatron", "veomni")),
    Key("critic.ppo_mini_batch_size", INT, follows=f"{ACTOR}.ppo_mini_batch_size", minimum=1),
    Key("critic.ppo_micro_batch_size", INT, None, nullable=True, minimum=1),
    Key("critic.ppo_micro_batch_size_per_gpu", INT, follows="critic.ppo_micro_batch_size", nullable=True, minimum=1),
    Key("critic.forward_micro_batch_size", INT, follows="critic.ppo_micro_batch_size", nullable=True, minimum=1),
    Key(
        "critic.forward_micro_batch_size_per_gpu",
        INT,
        follows="critic.ppo_micro_batch_size_per_gpu",
        nullable=True,
        minimum=1,
    ),
    Key("critic.use_dynamic_bsz", BOOL, follows=f"{ACTOR}.use_dynamic_bsz"),
    Key("critic.ppo_max_token_len_per_gpu", INT, 32768, minimum=1),
    Key("critic.forward_max_token_len_per_gpu", INT, follows="critic.ppo_max_token_len_per_gpu", minimum=1),
    Key("critic.ppo_epochs", INT, follows=f"{ACTOR}.ppo_epochs", minimum=1),
    Key("critic.ulysses_sequence_parallel_size", INT, 1, minimum=1),
    Key("critic.loss_agg_mode", STR, follows=f"{ACTOR}.loss_agg_mode"),
    Key("critic.model.use_remove_padding", BOOL, True, legacy_default=False),
    # algorithm
    Key("algorithm.adv_estimator", STR, "gae", doc="grpo, gae, rloo, reinforce_plus_plus, remax, ..."),
    Key("algorithm.norm_adv_by_std_in_grpo", BOOL, True),
    Key("algorithm.use_kl_in_reward", BOOL, False),
    Key("algorithm.kl_penalty", STR, "kl"),
    Key("algorithm.kl_ctrl.type", STR, "fixed", choices=("fixed", "adaptive"), doc="in-reward KL controller"),
    Key("algorithm.kl_ctrl.kl_coef", FLOAT, 0.001, minimum=0, doc="in-reward KL coefficient (initial for adaptive)"),
    Key("algorithm.kl_ctrl.horizon", INT, 10000, doc="adaptive controller horizon (steps)"),
    Key("algorithm.kl_ctrl.target_kl", FLOAT, 0.1, doc="adaptive controller target KL"),
    Key("algorithm.gamma", FLOAT, 1.0),
    Key("algorithm.lam", FLOAT, 1.0),
]


def _megatron_block(prefix: str, follow: str | None) -> list[Key]:
    """``<role>.megatron.*``: verl 0.9.1's ``McoreEngineConfig`` keys labkit models (``engine/megatron.yaml``); the
    ref's sizes follow the actor's (``follow``), as its YAML's ``oc.select`` does."""
    m = f"{prefix}.megatron"

    def k(leaf: str, type_: str, default: Any, nullable: bool = False, follows: bool = True, **kw: Any) -> Key:
        src = f"{follow}.megatron.{leaf}" if follow and follows else None
        return Key(f"{m}.{leaf}", type_, None if src else default, nullable=nullable, follows=src, **kw)

    tc = "override_transformer_config"
    return [
        k("tensor_model_parallel_size", INT, 1, minimum=1, doc="Megatron TP"),
        k("pipeline_model_parallel_size", INT, 1, minimum=1, doc="Megatron PP (pipeline stages)"),
        k("virtual_pipeline_model_parallel_size", INT, None, nullable=True, minimum=1, doc="VPP chunks per stage"),
        k("context_parallel_size", INT, 1, minimum=1, doc="Megatron CP"),
        k("expert_model_parallel_size", INT, 1, minimum=1, doc="Megatron EP"),
        k("expert_tensor_parallel_size", INT, None, nullable=True, minimum=1, doc="expert TP (None: = TP)"),
        k("sequence_parallel", BOOL, True, follows=False, doc="Megatron sequence parallel (off at TP = 1)"),
        k("use_distributed_optimizer", BOOL, True, follows=False, doc="optimizer state sharded over DP·CP"),
        k("param_offload", BOOL, False, doc="bf16 params on CPU outside the engine's own passes"),
        k("optimizer_offload", BOOL, False, follows=False, doc="fp32 main params and Adam on CPU"),
        k("grad_offload", BOOL, False, follows=False, profiles=("legacy",), doc="0.7.1: grads on CPU (not in 0.9.1)"),
        k("dynamic_context_parallel", BOOL, False, doc="dynamic CP (DP×CP ranks share each batch)"),
        k("max_seqlen_per_dp_cp_rank", INT, None, nullable=True, minimum=1, profiles=("engine",)),
        k("forward_only", BOOL, follow is not None, follows=False, doc="no grads or optimizer (the ref)"),
        k(f"{tc}.recompute_granularity", STR, None, nullable=True, doc="null | full | selective"),
        k(f"{tc}.recompute_method", STR, None, nullable=True, doc="full: uniform | block"),
        k(f"{tc}.recompute_num_layers", INT, None, nullable=True, doc="full: layers recomputed per stage"),
        k(f"{tc}.recompute_modules", STRLIST, ["core_attn"], doc="selective: modules recomputed"),
        k(f"{tc}.microbatch_group_size_per_vp_stage", INT, None, nullable=True, minimum=1, doc="G (None: = PP)"),
        k(f"{tc}.num_layers_in_first_pipeline_stage", INT, None, nullable=True, minimum=0, doc="uneven PP: stage 0"),
        k(f"{tc}.num_layers_in_last_pipeline_stage", INT, None, nullable=True, minimum=0, doc="uneven PP: last"),
        k(f"{tc}.pipeline_model_parallel_layout", STR, None, nullable=True, doc="custom PP layout, e.g. Et*6|t*6|t*5L"),
    ]


_KEYS += _megatron_block(ACTOR, None) + _megatron_block(REF, ACTOR) + _megatron_block("critic", None)


def _veomni_block(prefix: str, follow: str | None = None) -> list[Key]:
    """``<role>.veomni.*``: verl 0.9.1's ``VeOmniEngineConfig`` sizes (``engine/veomni.yaml``, engine profile only);
    the ref's parallel sizes follow the actor's (``follow``), as its YAML's ``oc.select`` does."""
    m = f"{prefix}.veomni"

    def size(leaf: str, doc: str) -> Key:
        src = f"{follow}.veomni.{leaf}" if follow else None
        return Key(f"{m}.{leaf}", INT, None if src else 1, follows=src, minimum=1, profiles=("engine",), doc=doc)

    return [
        size("ulysses_parallel_size", "VeOmni Ulysses SP size"),
        size("expert_parallel_size", "VeOmni expert parallel size"),
        Key(f"{m}.fsdp_size", INT, -1, profiles=("engine",), doc="VeOmni FSDP group (-1: all GPUs)"),
        Key(f"{m}.param_offload", BOOL, False, profiles=("engine",)),
        Key(f"{m}.optimizer_offload", BOOL, False, profiles=("engine",)),
    ]


_KEYS += _veomni_block(ACTOR) + _veomni_block(REF, ACTOR) + _veomni_block("critic")

KEYS: dict[str, Key] = {k.path: k for k in _KEYS}
