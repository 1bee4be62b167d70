"""labkit: verl's batch pipeline, re-implemented on real processes (see README.md and shared DESIGN.md).

Layers, imports pointing downward only: presentation (viz, widgets, cli) → orchestration (trainer) → compute
(model, rollout, actor, algo) → communication (dist, controller) → data (protocol) → arithmetic (config, validate,
plan, balance, microbatch). Import submodules directly: ``from labkit.plan import plan``.
"""

__version__ = "0.1.0"
