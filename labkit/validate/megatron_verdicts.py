"""Where and why of every Megatron verdict, and how one is recorded: the location in verl or megatron-core
(``WHERE``) and the plain reason (``WHY``) of each code of ``labkit.rules.megatron_rules`` /
``megatron_schedule`` / ``pipeline_layout``, for the start-up, worker-init and step-1 Megatron rules alike.
"""

from __future__ import annotations

from labkit.rules import megatron_rules as mr
from labkit.validate.snapshot import NOTICE, Recorder, Snap

CFG_PY, ENGINE_PY = (
    "verl/utils/config.py: validate_config",
    "verl/workers/config/engine.py: McoreEngineConfig.__post_init__",
)
IMPL = "verl/workers/engine/megatron/transformer_impl.py: MegatronEngine"
MG_W = "verl/workers/megatron_workers.py"
MCORE = "megatron/core"
WHERE = {
    "E2": CFG_PY,
    "M1": CFG_PY,
    "E1": CFG_PY,
    "M2": ENGINE_PY,
    "M3": ENGINE_PY,
    "M4": f"{IMPL}.__init__ -> _check_dcp_unsupported_features",
    "M5": f"{IMPL}.__init__ -> _check_dcp_unsupported_features",
    "M6": f"{IMPL}._init_device_mesh -> verl/utils/dynamic_cp_scheduler.py: get_megatron_dynamic_cp_scheduler_cls",
    "M7": f"{MCORE}/parallel_state.py: initialize_model_parallel",
    "M8": f"{MCORE}/parallel_state.py: initialize_model_parallel",
    "M9": f"{MCORE}/parallel_state.py: initialize_model_parallel",
    "M10": f"{MCORE}/model_parallel_config.py: ModelParallelConfig.__post_init__",
    "M11": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M12": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M13": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M14": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M15": f"{MCORE}/transformer/transformer_config.py: TransformerConfig.__post_init__",
    "M16": f"{MCORE}/tensor_parallel/utils.py: VocabUtility.vocab_range_from_global_vocab_size",
    "M17": f"{MCORE}/transformer/transformer_block.py: get_num_layers_to_build",
    "M18": f"{MCORE}/transformer/transformer_block.py: get_num_layers_to_build",
    "M19": f"{MCORE}/transformer/moe/moe_layer.py: MoELayer.__init__",
    "M20": f"{MCORE}/transformer/transformer_block.py: get_num_layers_to_build",
    "M26": f"{MCORE}/transformer/pipeline_parallel_layer_layout.py: PipelineParallelLayerLayout",
    "M22": f"{MCORE}/pipeline_parallel/schedules.py: forward_backward_pipelining_with_interleaving",
    "M23": f"{MCORE}/pipeline_parallel/schedules.py: forward_backward_pipelining_with_interleaving",
}
WHY = {
    "E2": "With the Megatron backend every model replica needs TP x PP x CP whole GPUs (checked without dynamic bsz).",
    "M1": "validate_config computes minimal_bsz = DP x actor.ppo_micro_batch_size_per_gpu; the key is null.",
    "E1": "Without dynamic batch size the B x n samples must split into DP ranks of whole micro-batches of m.",
    "M2": "Dynamic context parallel needs a positive max_seqlen_per_dp_cp_rank.",
    "M3": "verl prints this and builds the model without sequence parallel (megatron-core refuses SP at TP = 1).",
    "M4": "Dynamic CP packs sequences (THD), so padding removal must be on.",
    "M5": "Dynamic CP and the interleaved (virtual) pipeline schedule do not mix.",
    "M6": "megatron-core 0.16.1 has no dynamic-CP scheduler; verl refuses dynamic_context_parallel with it.",
    "M7": "megatron-core's DP = W / (TP x PP x CP) must be whole.",
    "M8": "A virtual pipeline size needs at least two pipeline stages.",
    "M9": "The expert layout ETP x EP x PP must divide the GPUs (expert DP = W / (ETP x EP x PP)).",
    "M10": "megatron-core only warns: expert parallel with TP and without SP.",
    "M11": "Tensor parallel splits the attention heads.",
    "M12": "KV heads (query groups) are split over TP, or replicated when TP is a multiple of them.",
    "M13": "Expert parallel needs an MoE model.",
    "M14": "The recompute settings of override_transformer_config are inconsistent.",
    "M15": "selective recompute accepts only megatron-core's module names.",
    "M16": "The embedding and output layer split the vocabulary over TP; verl pads nothing.",
    "M17": "Every pipeline stage builds the same number of decoder layers.",
    "M18": "Each stage's layers are cut into VPP model chunks.",
    "M19": "Bare assert: every EP rank holds the same number of experts.",
    "M20": "With num_layers_in_first/last_pipeline_stage the other stages split the layers left over evenly.",
    "M26": "A custom pipeline layout places every decoder layer itself: E first, L last, t as many as the model has.",
    "M22": "The interleaved schedule runs micro-batches in groups of G; G must lie in [PP, micro-batches].",
    "M23": "A last group of fewer than PP micro-batches would stall the interleaved pipeline.",
}


def add_verdict(
    rec: Recorder, v: mr.Verdict, when: str, role: str, where: str | None = None, why: str | None = None
) -> bool:
    """Record one verdict; warnings are notices. Returns True when it raised."""
    sev = NOTICE if v.exc_type is None else "error"
    rec.add(
        v.fired,
        v.code,
        v.exc_type,
        v.message,
        when,
        where or WHERE[v.code],
        list(v.arithmetic),
        why or WHY[v.code],
        sev,
        role,
    )
    return v.fired and v.exc_type is not None


def megatron_key(s: Snap, leaf: str, role: str = "actor") -> object:
    """The effective value of ``<role>.megatron.<leaf>`` (the actor's unless ``role`` says otherwise)."""
    prefix = {"actor": "actor_rollout_ref.actor", "ref": "actor_rollout_ref.ref", "critic": "critic"}[role]
    return s.cfg.get(f"{prefix}.megatron.{leaf}")
