"""Orchestration layer: one or more RL steps on real ranks, driven from the driver.

Holds the live GRPO trainer (``grpo_trainer``, with its stages up to the balanced batch in ``step_rollout`` and its
trace next to the prediction in ``live_trace``), a live rollout next to its prediction (``live_rollout``), what a live
run reads from its config (``live_config``), what a group needs for its rollout engine (``engine_setup``) and configs
under which the tiny task learns (``recipes``). May import: ``labkit.rl`` and every layer below it.
"""
