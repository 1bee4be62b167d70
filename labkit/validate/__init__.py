"""Arithmetic layer: every batch-size check verl performs, per profile and engine, with its message, when and the fix.

Each check is a small rule (``rulebook``: ``Rule`` with its codes, ``When`` it applies: profile, engine, loop,
roles) over the snapshot of a resolved run (``snapshot``: ``Snap``, the ``Finding`` of one check and the ``Recorder``
that keeps them in order). Three stages list their rules in verl's own order: start-up (``startup``, with
``startup_critic``, ``startup_notices`` and the micro-size pairs of ``micro_pairs``), worker init (``worker_init``,
with ``legacy_workers``' normalisation and ``ulysses_init``'s mesh and head checks) and step 1 (``first_step``, with
``v1_batch``, the DP ``dispatch``, the ``forward_passes`` built on ``micro_checks``, the ``update_checks`` and the
FSDP and Megatron critic/actor rules of ``fsdp_step`` and ``megatron_step``; ``step_state`` is what they share).
The Megatron backend's start-up and init rules are ``megatron_checks`` (where and why of its verdicts in
``megatron_verdicts``). ``report`` runs the stages and the smallest-fix search (``fixes``, over the candidates of
``fix_candidates`` and ``megatron_fixes``); ``batch_sizes`` holds the normalised sizes the planner reads.
May import: ``labkit.rules``, ``labkit.config``, ``labkit.trace``.
"""
