"""Arithmetic layer: the batch rules, each written once, and the resolved run they are read into.

``run`` holds the ``Run``: one config read once per answer into its release, loop, geometry and layouts, which
``check``, ``plan``, ``memory``, ``diagnose``, the dashboard and the live runs take instead of re-reading the config.
Holds the batch geometry derived from a config (``geometry``: prompts, samples, world, DP and SP sizes, rollout
mesh, the workload formula, ceiling division, Ulysses padding, the ``gen_batch_size`` fallback), the mini-batch
rules of an update (``mini_batches``: the legacy normalisation with E20–E22, the engine's E28/E29), the failure verl
raises at a stage (``failures``), whether dynamic micro-batching syncs its count over the DP group (``dp_sync``),
the collective names planner and runtime share (``collectives``) and the error catalogue (``catalogue``: every
code's message, location, when and why), the training engine's parallel layout (``parallel_layout``: FSDP, Megatron,
VeOmni), megatron-core's rank groups (``megatron_ranks``) and Megatron's batch rules (``megatron_rules``,
``megatron_config_rules``, ``megatron_schedule``). May import: ``labkit.config``, ``labkit.trace``.
"""
