"""The collectives a training step issues, by stable name: the planner predicts their counts per rank and stage,
the live runtime counts the same names, so the two can be compared one to one.
"""

from __future__ import annotations

# Stable collective names. Counts are calls issued by one rank in one stage of one training step; a call that runs
# once per FSDP unit or per attention layer (params all-gather, Ulysses all-to-all) is counted once per pass.
COLLECTIVES: dict[str, str] = {
    "all_gather(data_proto)": "≤v0.5 DP_COMPUTE_PROTO pre-processing: inputs all-gathered inside the rollout TP "
    "group (generate) or the Ulysses SP group (log-prob, update); once per call (all_gather_data_proto)",
    "all_reduce(max):num_micro_batches": "dynamic micro-batching: MAX of the micro-batch count over the DP group "
    "(legacy: the world group); once per rearrange_micro_batches call",
    "all_reduce(max):group_stats": "engine (0.9.1) dynamic micro-batching: MAX of (longest forced group, -#groups) "
    "before partitioning; once per rearrange_micro_batches call",
    "all_reduce(min):within_limit": "engine (0.9.1) hard token cap: AND of 'every bucket fits' over the DP group; "
    "once per partition attempt",
    "all_reduce(sum):batch_num_tokens": "engine forward_backward_batch: loss-mask tokens of the batch over the DP "
    "group (the global loss denominator); once per call (log-prob) or per mini-batch (update)",
    "all_gather(params)": "FSDP parameter all-gather for a forward pass; once per micro-batch forward",
    "all_gather(params):backward": "FSDP parameter re-gather for a backward pass (reshard after forward); once per "
    "micro-batch backward",
    "reduce_scatter(grads)": "FSDP gradient reduce-scatter: legacy after every micro-batch backward; engine only "
    "on the last micro-batch of a mini-batch (no_sync)",
    "all_reduce(sum):grad_norm": "gradient-norm all-reduce of clip_grad_norm_; once per optimizer step",
    "all_to_all(ulysses)": "Ulysses head/sequence all-to-all; once per micro-batch forward (sp > 1)",
    "all_to_all(ulysses):backward": "Ulysses all-to-all in the backward pass; once per micro-batch backward (sp > 1)",
    "all_gather(ulysses_outputs)": "gather_outputs_and_unpad of log-probs (or values) over the SP group; once per "
    "micro-batch forward (sp > 1)",
    "all_reduce(avg):loss": "engine (0.9.1) _postprocess_output: the summed micro-batch losses AVG-reduced over the "
    "DP group; once per forward-only call and once per update mini-batch",
    "all_gather_object(metrics)": "engine (0.9.1) _postprocess_output: every rank's metrics gathered over the DP "
    "group (allgather_dict_into_dict); once per forward-only call and once per update mini-batch",
    "all_gather_object(global_token_num)": "engine (0.9.1) train_mini_batch: each row's tokens gathered over the DP "
    "group for MFU; once per update mini-batch",
    "all_reduce(tp)": "rollout TP: the row-parallel partial sums (attention o_proj and MLP down_proj) all-reduced in "
    "the TP group; 2 per decoder layer per forward step of generate",
    "broadcast(tp):logits": "rollout TP: each forward step's logits broadcast from TP rank 0 so every TP rank samples "
    "the same token (labkit's stand-in for vLLM's driver-side sampling); once per forward step",
    "all_gather(tp_sp)": "Megatron sequence parallel: a layer's input all-gathered over the TP group before its "
    "column-parallel linears; counted once per micro-batch forward (it runs in every layer)",
    "reduce_scatter(tp_sp)": "Megatron sequence parallel: a row-parallel linear's output reduce-scattered over the TP "
    "group; counted once per micro-batch forward (every layer)",
    "all_gather(tp_sp):backward": "the backward of Megatron's sequence-parallel reduce-scatter; once per micro-batch "
    "backward",
    "reduce_scatter(tp_sp):backward": "the backward of Megatron's sequence-parallel all-gather; once per micro-batch "
    "backward",
    "all_reduce(megatron_tp)": "Megatron TP without sequence parallel: the row-parallel partial sums all-reduced over "
    "the TP group; counted once per micro-batch forward (every layer)",
    "all_reduce(megatron_tp):backward": "the backward of a column-parallel linear's input: gradients all-reduced over "
    "the TP group; once per micro-batch backward",
    "ring_exchange(cp)": "Megatron context parallel: K/V chunks passed around the CP ring in each attention layer; "
    "counted once per micro-batch forward",
    "ring_exchange(cp):backward": "context parallel's ring in the attention backward; once per micro-batch backward",
    "recv(pp):activation": "pipeline parallel: the previous stage's output received; once per micro-batch forward "
    "(every stage but the first)",
    "send(pp):activation": "pipeline parallel: this stage's output sent to the next; once per micro-batch forward "
    "(every stage but the last)",
    "recv(pp):grad": "pipeline parallel: the gradient of this stage's output received from the next stage; once per "
    "micro-batch backward (every stage but the last)",
    "send(pp):grad": "pipeline parallel: the gradient of this stage's input sent to the previous stage; once per "
    "micro-batch backward (every stage but the first)",
    "reduce_scatter(dp_cp):grads": "Megatron's distributed optimizer: gradients reduce-scattered over the DP×CP group "
    "(bucket by bucket); once per optimizer step",
    "all_gather(dp_cp):params": "Megatron's distributed optimizer: updated parameter shards all-gathered over DP×CP; "
    "once per optimizer step",
    "all_reduce(dp_cp):grads": "Megatron DDP without the distributed optimizer: gradients all-reduced over DP×CP; once "
    "per optimizer step",
    "all_gather(tp):fingerprint": "rollout TP: a fingerprint of the prompts before generate and of the outputs after, "
    "gathered to check every TP rank holds the same rows; twice per generate call",
}


def micro_batch_sync_name(op: str, max_syncs_before: int) -> str:
    """The name of a DP all-reduce of rearrange_micro_batches: a MIN is the hard cap's "every bucket fits"; the first
    MAX syncs the micro-batch count, a later one (engine) the group stats."""
    if op == "min":
        return "all_reduce(min):within_limit"
    return "all_reduce(max):num_micro_batches" if max_syncs_before == 0 else "all_reduce(max):group_stats"


def tp_generate_collectives(num_layers: int, forward_steps: int, tp: int, sync_logits: bool = True) -> dict[str, int]:
    """Collectives one rank of a rollout TP group issues in one generate call of ``forward_steps`` tokens (the longest
    response of its replica's rows): none at TP 1."""
    if tp <= 1:
        return {}
    out = {"all_gather(tp):fingerprint": 2, "all_reduce(tp)": 2 * num_layers * forward_steps}
    if sync_logits:
        out["broadcast(tp):logits"] = forward_steps
    return out
