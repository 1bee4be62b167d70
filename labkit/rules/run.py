"""The resolved run: one user config read once per answer into everything the layers above ask of it.

A ``Run`` holds the config (its release and profile), the loop, the batch geometry and the training engine's
parallel layout (FSDP dp×sp, Megatron tp·cp·ep·dp·pp with VPP, VeOmni), the rollout mesh and the roles verl builds.
``check``, ``plan``, ``memory``, ``diagnose``, the dashboard and the live runs take it (or a config they resolve once
at their door with ``as_run``); none rebuilds the geometry. ``Run.resolve`` reads a copy of the config (a run kept
while its caller may change the config); ``as_run`` reads the caller's config in place for the call it serves, so
what the call reads is recorded where the caller records (``VerlConfig.recording``). A changed config (a fix, a
later step) is another run: ``with_values`` / ``at_step``. The pattern is megatron-core's ``parallel_state`` and
torchtitan's ``ParallelDims``: sizes derived in one place, handed down.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from labkit.config.unread_keys import audit_path
from labkit.config.verl_config import VerlConfig
from labkit.config.versions import Release
from labkit.rules.geometry import BatchGeometry
from labkit.rules.parallel_layout import ParallelLayout


@dataclass(frozen=True)
class Run:
    """One config resolved once: read its values with ``get``/``raw``, its sizes from ``geometry`` and ``layout``."""

    config: VerlConfig
    """The user's config as resolved: a copy (``resolve``) or the caller's for one call (``as_run``), never changed."""
    geometry: BatchGeometry
    """The step's sizes (``labkit.rules.geometry.BatchGeometry``), built once, for ``geometry.global_step``."""
    need_reference_policy: bool
    """verl builds and runs the reference policy (``VerlConfig.need_reference_policy``)."""
    need_critic: bool
    """verl builds and runs the critic (``VerlConfig.need_critic``)."""
    reads: frozenset[str] = frozenset()
    """The keys resolving read (the geometry's, the layout's, the roles'): an answer's record of what it priced
    starts from them."""
    _derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """What the layers above derived from this run once (``derive``): verl's verdict on it."""

    @classmethod
    def resolve(cls, cfg: VerlConfig, global_step: int = 1, failed_sessions: Sequence[int] = ()) -> Run:
        """Read ``cfg`` once into a run for global step ``global_step`` (ValueError as ``BatchGeometry.from_config``)."""
        return cls.reading(cfg.copy(), global_step, failed_sessions)

    @classmethod
    def reading(cls, own: VerlConfig, global_step: int = 1, failed_sessions: Sequence[int] = ()) -> Run:
        """The run of ``own`` read in place (no copy): for a config no one changes while the run is used (``resolve``'s
        copy, a run's own at another step, a config a call resolves at its door)."""
        with own.recording() as reads:
            geometry = BatchGeometry.from_config(own, global_step, failed_sessions)
            roles = own.need_reference_policy, own.need_critic
        return cls(own, geometry, *roles, frozenset(reads))

    # -- what the config says, read through the run ------------------------------------------------
    @property
    def profile(self) -> str:
        """``legacy`` (verl ≤ 0.7 workers) or ``engine`` (verl 0.9.1 engine workers)."""
        return self.config.profile

    @property
    def release(self) -> Release | None:
        """The verl release the user named (``--verl``), None for the profile's own."""
        return self.config.release

    @property
    def loop(self) -> str:
        """The trainer loop: ``legacy``, ``v0`` or ``v1`` (``labkit.rules.v1_loop.loop_of``)."""
        return self.geometry.loop

    @property
    def layout(self) -> ParallelLayout:
        """The actor's training layout, read with the geometry (every colocated Megatron role runs with it)."""
        return self.geometry.parallel

    @property
    def is_megatron(self) -> bool:
        """The training engine is Megatron (``model_engine=megatron`` / the Megatron workers)."""
        return self.layout.is_megatron

    @property
    def audit_path(self) -> str | None:
        """``"<release> <loop> <engine>"`` whose code ``data/unread_keys.yaml`` audited, or None (another release)."""
        version = self.release.version if self.release is not None else None
        return audit_path(self.profile, version, self.loop, self.is_megatron)

    @property
    def n_gpus(self) -> int:
        """W = ``trainer.n_gpus_per_node`` × ``trainer.nnodes``."""
        return self.geometry.world_size

    def get(self, path: str) -> Any:
        """The effective value of a verl key (``VerlConfig.get``: set, followed or default; the read is recorded)."""
        return self.config.get(path)

    def raw(self, path: str, default: Any = None) -> Any:
        """A key labkit's schema does not model, as set (``VerlConfig.raw``)."""
        return self.config.raw(path, default)

    def is_set(self, path: str) -> bool:
        """The user set ``path`` (``VerlConfig.is_set``)."""
        return self.config.is_set(path)

    def derive(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per run under ``name`` (a pure function of the run, e.g. verl's verdict on it), then
        the same answer each time it is asked."""
        if name not in self._derived:
            self._derived[name] = compute()
        return self._derived[name]

    # -- other runs --------------------------------------------------------------------------------
    def with_values(self, **values: Any) -> Run:
        """The run of this config with ``values`` set as they are (a fix's run; release and set-aside keys kept)."""
        cfg = self.config.copy()
        cfg.values.update(values)
        return Run.reading(cfg, self.geometry.global_step)

    def at_step(self, global_step: int, failed_sessions: Sequence[int] = ()) -> Run:
        """This config at another global step (v1's padding multiple and the first actor update move with it)."""
        if global_step == self.geometry.global_step and tuple(failed_sessions) == self.geometry.failed_sessions:
            return self
        return Run.reading(self.config, global_step, failed_sessions)


def as_run(cfg: VerlConfig | Run, global_step: int | None = None, failed_sessions: Sequence[int] = ()) -> Run:
    """The run of ``cfg`` for the call at hand: a run as it is (at ``global_step`` when one is asked), else the config
    read once, here, in place, for ``global_step`` (default 1: the first step). A run kept beyond the call while the
    config may change is ``Run.resolve``'s."""
    if isinstance(cfg, Run):
        return cfg if global_step is None and not failed_sessions else cfg.at_step(global_step or 1, failed_sessions)
    return Run.reading(cfg, global_step or 1, failed_sessions)
