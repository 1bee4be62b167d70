"""Communication layer: verl's single controller on real processes.

Holds the Worker base class, ``register`` and the dispatch/collect modes (``dispatch``), the driver's WorkerGroup
(``worker_group``), the Ray and local-process launchers (``ray_launcher``, ``local_launcher``), the in-rank host
(``rank_host``), torch.distributed inside a rank: process groups, meshes, collectives with timeouts (``dist``), the
per-rank collective log behind the hang report (``collective_log``), errors that name the failing rank
(``rank_errors``), the files ranks make outside their processes and their sweep (``rank_files``), the machine's
facts for the rollout engine's plan (``host``) and a small demo worker (``demo_worker``). May import: ``labkit.protocol`` and the arithmetic layer.
"""
