"""Arithmetic layer, top: the planner, what every rank holds at every stage of one training step.

Holds the planner's per-step state (``context``), the stages before the actor's forward passes
(``rollout_stages``; v1's in ``v1_stages``), the forward and update stages on the actor and critic meshes
(``train_stages``, their mini-batches and loss scales in ``update_batches``, their collectives in
``train_collectives``), their micro-batches (``micro_batches``), which keys drive each stage (``roles``), the rollout
engine's arguments from the rollout keys (``rollout_engine``, the plan's record in ``engine_plan``), the hang risks
of dynamic micro-batching (``hang_risk``), v1's failed sessions (``sessions``), the tables (``tables``), the loops
(``loops``), Megatron's passes (``megatron_passes``: rows by DP coordinate, padding to TP·CP·2,
collectives per stage), megatron-core's pipeline schedules (``pipeline_schedule``) and the entry point ``step.plan``, which takes the resolved run (``labkit.rules.run``).
May import: ``labkit.validate``, ``labkit.balance``, ``labkit.rules``, ``labkit.config``, ``labkit.trace``.
"""
