"""Arithmetic layer: every batch-size check verl performs, per profile, with its message, when and the fix.

Holds the snapshot of a config the checks read and the recorder of their findings (``snapshot``), the start-up
checks (``startup``), the worker-init checks (``worker_init``), the first-step checks (``first_step``, with the
forward/update micro-batch checks of ``micro_checks``), the Megatron backend's checks (``megatron_checks``, with
their fix candidates in ``megatron_fixes``), the smallest-fix search (``fixes``) and the report that runs them all
(``report``). May import: ``labkit.rules``, ``labkit.config``, ``labkit.trace``.
"""
