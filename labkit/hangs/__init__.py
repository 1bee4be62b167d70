"""Orchestration layer (beside ``labkit.trainer``): verl's batch-size hangs reproduced on real ranks and diagnosed.

Holds the lab's rank-side stage runner (``worker``), the rank-by-rank verdict (``diagnosis``) and the four
reproductions with their fixes (``reproduce``). May import: ``labkit.rl`` and every layer below it, never
``labkit.trainer``.
"""
