"""Arithmetic layer: sequence balancing.

Holds Karmarkar-Karp partitioning exact to verl's heap order (``kk``), the trainer's ``_balance_batch``
(``balance_batch``), dynamic and static micro-batching on one DP rank (``micro_batches``, with the plan it returns
in ``micro_batch_plan``) and on every DP rank at once with verl's all-reduces answered in lockstep (``lockstep``).
May import: ``labkit.rules``, ``labkit.config``, ``labkit.trace``.
"""
