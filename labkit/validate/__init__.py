"""Arithmetic layer: every batch-size check verl performs, per profile, with its message, when and the fix.

Holds the start-up checks over a config snapshot (``startup``), the worker-init checks (``worker_init``), the
first-step checks (``first_step``), the smallest-fix search (``fixes``) and the report that runs them all
(``report``). May import: ``labkit.rules``, ``labkit.config``, ``labkit.trace``.
"""
