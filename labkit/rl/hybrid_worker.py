"""The hybrid-engine worker: actor, reference and rollout of one GRPO step on the same ranks (verl's colocated
``ActorRolloutRefWorker``), so a trainer needs one worker group and the rollout samples from the updated policy.

Design: the actor/ref (``labkit.rl.actor.ActorWorker``, FSDP2 over mesh "actor" = (dp, sp)) is the worker itself; the
rollout is a ``labkit.rl.rollout.RolloutWorker`` held inside it (its share of one rollout engine, vLLM or HF, mesh
"rollout" = (dp, infer_tp, infer_pp)), whose dispatch info is re-registered on the hybrid worker. Both use
``self.dp_rank`` for different meshes, so composition (not multiple inheritance) keeps them apart. ``update_weights``
gathers the actor's full weights (all-gather of the FSDP shards) and loads them into the live engine
(``labkit.rl.weight_sync``), as verl's ``checkpoint_manager.update_weights`` does after every ``update_actor``.
Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker (role "actor_rollout_ref", hybrid_engine=True).
"""

from __future__ import annotations

import resource
import time
from typing import Any

import torch

from labkit.protocol.data_proto import DataProto
from labkit.rl import actor_math as am
from labkit.rl import weight_sync
from labkit.rl.actor import ActorWorker
from labkit.rl.rollout import RolloutWorker
from labkit.runtime.dispatch import make_nd_compute_dataproto_dispatch_fn
from labkit.runtime.worker import Dispatch, register


class ActorRolloutRefWorker(ActorWorker):
    """One rank holding the FSDP2 actor + reference and a TP shard of the rollout model (hybrid engine)."""

    def __init__(self, rollout: dict | None = None, **settings: Any) -> None:
        super().__init__(**settings)
        self.rollout_kwargs = dict(rollout or {})
        self.rollout = RolloutWorker(**self.rollout_kwargs)

    @classmethod
    def check_world(cls, world_size: int, rollout: dict | None = None, **settings: Any) -> None:
        """Actor checks (E20–E22, E41, ...) and rollout checks (E23, TP head split) on the driver, before spawning."""
        ActorWorker.check_world(world_size, **settings)
        RolloutWorker.check_world(world_size, **dict(rollout or {}))

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Actor + ref (FSDP2) first, then the rollout mesh and its TP-sharded model from the same weights."""
        info = ActorWorker.init_model(self)
        if "rollout" not in self._lk_dispatch:
            rinfo = self.rollout.init_model()
            self._lk_dispatch["rollout"] = dict(self.rollout._lk_dispatch["rollout"])
            self._lk_groups.update(self.rollout._lk_groups)
            info["rollout"] = rinfo
        return info

    @register(make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout"))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """This rank's engine generates its replica's rows (every TP rank of a replica gets the same rows)."""
        return self.rollout._generate(prompts)

    @register(Dispatch.ONE_TO_ALL)
    def update_weights(self) -> dict[str, Any]:
        """Actor → rollout weight sync: all-gather the FSDP2 shards into full tensors, load them into this rank's
        engine (vLLM: in place; HF: a fresh TP-sharded copy). Mirrors verl's checkpoint_manager.update_weights
        (after update_actor)."""
        t0 = time.perf_counter()
        full = weight_sync.full_state_dict(self.model)
        t1 = time.perf_counter()
        loaded = self.rollout.engine.update_weights(full)
        return {
            "rank": self.rank,
            "engine": self.rollout.engine.name,
            "params": sum(v.numel() for v in full.values()),
            "digest": weight_sync.digest(full),
            "gather_s": t1 - t0,
            **loaded,
            "seconds": time.perf_counter() - t0,
        }

    def shutdown(self) -> dict[str, Any] | None:
        """The rollout engine's shutdown (called by the rank's host before its process group goes)."""
        return self.rollout.shutdown()

    @register(Dispatch.ONE_TO_ALL)
    def peak_memory(self) -> dict[str, Any]:
        """Peak resident memory of this rank's process so far (ru_maxrss, bytes; CPU ranks) and, on CUDA, the
        allocator's peak; the only memory figures a CPU rank can measure."""
        out = {"rank": self.rank, "peak_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated())
        return out


def settings_for(cfg: Any) -> am.ActorSettings:
    """The actor settings a trainer config gives (shipped tiny model), via ``labkit.rl.actor_math.settings_from_config``:
    the learning rate is ``actor_rollout_ref.actor.optim.lr`` (verl's default 1e-6); ``GRPOTrainer(lr=...)``
    overrides it when given."""
    return am.settings_from_config(cfg)
