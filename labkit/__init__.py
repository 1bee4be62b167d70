"""labkit: verl's batch pipeline, re-implemented on real processes.

The subpackages are layers; a module imports only from its own layer or the layers below it (``tests/test_layers.py``
and the import-linter contract in ``pyproject.toml`` enforce this), top to bottom:

=================  =====================================================================================
presentation       ``ui`` (plotly figures, ipywidgets panels, notebook helpers), ``cli``
orchestration      ``trainer`` (GRPO steps on a worker group, the live rollout, recipes)
compute            ``rl`` (RL math, reward, rollout, actor worker and client) above ``model`` (the tiny
                   Qwen2, TP shards, packing, Ulysses, log-probs)
communication      ``runtime`` (worker group, dispatch, launchers, rank hosts, process groups)
data               ``protocol`` (DataProto over TensorDict)
arithmetic         ``plan`` above ``validate`` and ``balance`` above ``rules`` (the batch geometry, the
                   error catalogue) above ``config`` (keys, YAML + overrides, lengths); ``trace`` (the
                   record of what each rank holds at each stage) is the bottom, shared by all
=================  =====================================================================================

Import submodules directly, e.g. ``from labkit.plan.step import plan``.
"""

__version__ = "0.1.0"
