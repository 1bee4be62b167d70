"""Communication layer: verl's single controller on real processes.

Holds what a worker class declares: the Worker base class, ``register`` and the dispatch modes (``worker``); the
dispatch/collect rules (``dispatch``); the driver's WorkerGroup (``worker_group``) with what it prepares before ranks
start (``group_start``), its watchdog over a call (``call_watchdog``) and a call's future and trace records
(``live_call``); the Ray launcher and Ray's quiet start (``ray_launcher``, ``ray_init``), the local-process launcher and
its pipes (``local_launcher``, ``rank_pipes``), rank processes seen from /proc (``processes``); the in-rank host
(``rank_host``); torch.distributed inside a rank: the process group (``process_group``), verl's meshes (``meshes``),
collectives with timeouts (``dist``); the per-rank collective log behind the hang report (``collective_log``), errors
that name the failing rank (``rank_errors``), the files ranks make outside their processes and their sweep
(``rank_files``), the machine's facts for the rollout engine's plan (``host``) and a small demo worker
(``demo_worker``). May import: ``labkit.protocol`` and the arithmetic layer.
"""
