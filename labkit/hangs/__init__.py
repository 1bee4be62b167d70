"""Orchestration layer (beside ``labkit.trainer``): verl's batch-size hangs reproduced on real ranks and diagnosed.

Holds the lab's rank-side stage runner (``worker``), the rank-by-rank verdict (``diagnosis``), the four
reproductions with their fixes (``reproduce``), hang (a) on the FSDP2 training actor itself (``fsdp``), the
Megatron pipeline's hangs on real stage ranks (``pipeline_hang``) and the predicted collectives that depend on a
run's output (``accounting``). May import: ``labkit.rl`` and every layer below it, never ``labkit.trainer``.
"""
