"""Arithmetic layer: the batch rules, each written once.

Holds the batch geometry derived from a config (``geometry``: prompts, samples, world, DP and SP sizes, rollout
mesh, normalised mini-batches, the workload formula, Ulysses padding), the failures verl raises at a stage
(``failures``), the collective names planner and runtime share (``collectives``) and the error catalogue
(``catalogue``). May import: ``labkit.config``, ``labkit.trace``.
"""
