"""Arithmetic layer, top: a failed verl run's log read and answered (``labkit diagnose``).

Holds the log's lines without Ray's prefixes and colours (``log_lines``), the config it recovers: verl's startup
dump, Hydra's override list, the launch command (``log_config``), the failures it names: CUDA and CPU allocation
failures, NCCL watchdog timeouts, verl's own messages, Ray's host-memory kills and dead actors, the phase from the
traceback (``log_failures``), the metrics lines (``log_metrics``), a failed allocation matched against the memory
model's tensors (``oom_match``), the answer (``answer``) and the command (``command``). docs/diagnose.md lists what
is read. May import: ``labkit.memory`` and everything below it.
"""
