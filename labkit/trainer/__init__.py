"""Orchestration layer: one or more RL steps on real ranks, driven from the driver.

Holds the live GRPO trainer (``grpo_trainer``), a live rollout next to its prediction (``live_rollout``), what a
group needs for its rollout engine (``engine_setup``) and configs under which the tiny task learns (``recipes``). May import: ``labkit.rl`` and every layer below it.
"""
