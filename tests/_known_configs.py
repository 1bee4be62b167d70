"""Configs several tests price: the issue's user with 8k responses on 8 H100s (old_log_prob OOMs at full width with
the eager entropy the known OOM reports ran)."""

GRPO_7B_8K = [
    "data.train_batch_size=256",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "data.max_prompt_length=1024",
    "data.max_response_length=8192",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",  # the eager entropy the known OOM reports ran;
    # verl's default torch.compile fuses it (the head then holds only the logits: the same step fits)
]
