"""Compute layer, upper half: the RL side of a rank.

Holds the RL math: GRPO advantage, PPO clipped loss, loss aggregation, KL (``algo``), the reward (``reward``),
rollout workers (``rollout``; what a rank knows before it loads and the driver's checks: ``rollout_setup``) and their
two engines behind one interface (``engines``: ``vllm_engine`` with ``vllm_worker``, ``hf_engine``; their shared
output layout ``rollout_output``), the weight sync into a live engine (``weight_sync``), the rollout-vs-actor log-prob
metrics (``rollout_metrics``), the training actor: its arithmetic (``actor_math``), model and checks
(``actor_model``), worker (``actor``), micro-batching (``actor_micro_batches``), update (``actor_update``), records
(``actor_record``) and driver-side client (``actor_client``), and the hybrid-engine worker (``hybrid_worker``).
May import: ``labkit.model`` and every layer below it.
"""
