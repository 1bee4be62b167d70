"""The training-side actor on real ranks: compute_log_prob / compute_ref_log_prob and update_actor, per profile,
with the actor and the reference sharded by FSDP2 (``fully_shard`` per decoder layer, then the root, over a 1-D mesh
of all W ranks) and Ulysses SP groups from the (dp, sp) mesh.

Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker (mesh "actor", dp_rank from the (dp, sp) mesh,
is_collect = sp rank 0), verl/workers/actor/dp_actor.py: DataParallelPPOActor (legacy) and the 0.9.1 engine path
(verl/workers/engine/fsdp/transformer_impl.py: FSDPEngine.forward_backward_batch, verl/workers/utils/losses.py:
ppo_loss). Every call records, per rank, its micro-batches and collectives under the planner's names
(``labkit.rules.collectives.COLLECTIVES``). The driver API (``start_actor_group``, ``configure``,
``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``) is ``labkit.rl.actor_client``; the update loop lives in
``labkit.rl.actor_update``, the micro-batching in ``labkit.rl.actor_micro_batches``, the model and the checks before a
batch in ``labkit.rl.actor_model``, the arithmetic in ``labkit.rl.actor_math``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from labkit.balance.micro_batches import restore_dynamic_batch
from labkit.model.logprob import forward_micro_batch
from labkit.protocol.data_proto import DataProto
from labkit.rl import actor_math as am
from labkit.rl.actor_micro_batches import ActorMicroBatches
from labkit.rl.actor_model import build_model, check_settings
from labkit.rl.actor_record import CallRecord
from labkit.runtime import dist, meshes, process_group
from labkit.runtime.dispatch import make_nd_compute_dataproto_dispatch_fn
from labkit.runtime.worker import Dispatch, Worker, register

LOG_PROB_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
MODEL_KEYS = ("param_dtype", "model_path", "model_config", "seed")


class ActorWorker(ActorMicroBatches, Worker):
    """One rank of the actor (and its reference): FSDP2 shards over all W ranks, Ulysses groups of size sp."""

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        self.s = am.ActorSettings(**settings)
        self.mini_legacy = check_settings(self.s, self.world_size)  # verl: in the worker's constructor
        self.model = self.ref = self.optimizer = None
        self.records: list[dict] = []

    @classmethod
    def check_world(cls, world_size: int, **settings: Any) -> None:
        """The same checks on the driver, before any process starts (E41 names the head count, never a hang)."""
        check_settings(am.ActorSettings(**settings), world_size)

    # ---- set-up ---------------------------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Meshes (once), then actor + reference sharded with FSDP2 and the optimizer (rebuilt on every call)."""
        from torch.distributed.device_mesh import init_device_mesh

        torch.set_num_threads(1)
        sp = self.s.ulysses_sequence_parallel_size
        if "actor" not in self._lk_dispatch:
            self.mesh = meshes.actor_mesh(sp)
            self.dp_rank, self.sp_rank = meshes.dp_rank(self.mesh), meshes.sp_rank(self.mesh)
            self.dp_size = self.world_size // sp
            self.dp_group, self.sp_group = self.mesh.get_group("dp"), self.mesh.get_group("sp")
            self._register_dispatch_collect_info(
                "actor", dp_rank=self.dp_rank, is_collect=self.sp_rank == 0, sp_rank=self.sp_rank
            )
            self.fsdp_mesh = init_device_mesh(meshes.device_type(), (self.world_size,), mesh_dim_names=("fsdp",))
            state = process_group.state()  # NCCL: one GPU per rank; gloo (CPU, or ranks sharing a GPU): the CPU
            self.device = torch.device(state.device if state is not None and state.backend == "nccl" else "cpu")
        self.model, self.ref = self._sharded(), self._sharded()
        self.ref.eval().requires_grad_(False)
        params = list(self.model.parameters())
        if self.s.optim == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=self.s.lr, weight_decay=self.s.weight_decay)
        else:
            self.optimizer = torch.optim.AdamW(
                params, lr=self.s.lr, betas=tuple(self.s.betas), weight_decay=self.s.weight_decay
            )
        return {
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "sp_rank": self.sp_rank,
            "dp_size": self.dp_size,
            "fsdp_world": self.world_size,
            "local_params": sum(p.to_local().numel() for p in params),
            "full_params": sum(p.numel() for p in params),
        }

    def _sharded(self) -> torch.nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = build_model(self.s).to(self.device)
        sp = self.s.ulysses_sequence_parallel_size
        if sp > 1:
            from labkit.model.ulysses import apply_ulysses_patch

            apply_ulysses_patch(model, sp)
        mp = MixedPrecisionPolicy()
        if self.s.param_dtype != "float32":
            mp = MixedPrecisionPolicy(param_dtype=getattr(torch, self.s.param_dtype), reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mesh=self.fsdp_mesh, mp_policy=mp)
        fully_shard(model, mesh=self.fsdp_mesh, mp_policy=mp)
        return model

    @register(Dispatch.ONE_TO_ALL)
    def configure(self, rebuild: bool = False, **changes: Any) -> dict[str, Any]:
        """Change settings on every rank (re-checked as at construction); model keys or ``rebuild`` rebuild the
        models and the optimizer from the seed (the mesh, and so sp, stays)."""
        new = self.s.with_(**changes)
        if new.ulysses_sequence_parallel_size != self.s.ulysses_sequence_parallel_size:
            raise ValueError("ulysses_sequence_parallel_size is fixed by the mesh; start a new worker group")
        self.mini_legacy = check_settings(new, self.world_size)
        model_changed = any(getattr(new, k) != getattr(self.s, k) for k in MODEL_KEYS)
        self.s = new
        if rebuild or model_changed:
            self.init_model()
        return new.as_dict()

    @register(Dispatch.ONE_TO_ALL)
    def take_records(self) -> list[dict]:
        """What each data call since the last take saw on this rank (micro-batches, collectives), oldest first."""
        out, self.records = self.records, []
        return out

    @register(Dispatch.ONE_TO_ALL)
    def full_params(self) -> dict[str, np.ndarray] | None:
        """The actor's full fp32 parameters (an all-gather on every rank); rank 0 returns them as numpy."""
        full = {n: p.full_tensor().detach().float().cpu() for n, p in self.model.named_parameters()}
        return {n: t.numpy().copy() for n, t in full.items()} if self.rank == 0 else None

    @register(Dispatch.ONE_TO_ALL)
    def usage(self) -> dict[str, float]:
        """This rank's CPU seconds and peak resident memory so far (what verl logs as perf/cpu_memory_used_gb)."""
        import resource
        import time

        return {
            "rank": self.rank,
            "cpu_s": time.process_time(),
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }

    # ---- log-probs --------------------------------------------------------------------------------------------------
    @register(make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """old_log_probs (+ entropys) of this DP rank's rows. Mirrors ActorRolloutRefWorker.compute_log_prob."""
        lp, ent = self._measured(lambda: self._log_prob(self.model, data, "actor", calculate_entropy=True))
        return DataProto.from_dict(
            tensors={"old_log_probs": lp, "entropys": ent}, meta_info={"temperature": data.meta_info["temperature"]}
        )

    @register(make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """ref_log_prob of this DP rank's rows. Mirrors ActorRolloutRefWorker.compute_ref_log_prob."""
        lp, _ = self._measured(lambda: self._log_prob(self.ref, data, "ref", calculate_entropy=False))
        return DataProto.from_dict(tensors={"ref_log_prob": lp})

    def _log_prob(self, model, data: DataProto, which: str, calculate_entropy: bool):
        s, sp = self.s, self.s.ulysses_sequence_parallel_size
        temperature = self._temperature(data)
        p = am.log_prob_params(s, which)
        rec = CallRecord(self, data)
        parts = None if p.dynamic else am.static_parts(s.profile, len(data), p.micro)  # E30 before any collective
        if s.profile == "engine":
            self._batch_num_tokens(rec, data, p.budget * sp if p.dynamic else None)
        if p.dynamic:
            parts = self._dynamic_parts(rec, data, p.budget * sp)
        model.eval()
        lps, ents = [], []
        stage = "old_log_prob" if which == "actor" else "ref_log_prob"
        with torch.no_grad():
            for i, idx in enumerate(parts):
                with dist.where(stage, i):
                    lp, ent = self._forward(rec, model, data, idx, temperature, calculate_entropy)
                lps.append(lp.cpu())
                ents.append(ent.cpu() if ent is not None else None)
        if s.profile == "engine":  # infer_batch's _postprocess_output: loss AVG-reduced, metrics gathered over DP
            from labkit.rl.actor_metrics import postprocess

            postprocess(self, rec, 0.0, {})
        lp = torch.cat(lps)
        ent = torch.cat(ents) if calculate_entropy else None
        if p.dynamic:
            lp = restore_dynamic_batch(lp, parts)
            ent = restore_dynamic_batch(ent, parts) if ent is not None else None
        self.records.append(rec.finish())
        return lp, ent

    def _forward(
        self, rec: CallRecord, model, data: DataProto, idx: list[int], temperature: float, calculate_entropy: bool
    ):
        """One micro-batch through forward_micro_batch (padded or packed, SP-split when sp > 1)."""
        sp = self.s.ulysses_sequence_parallel_size
        rows = torch.as_tensor(idx, dtype=torch.long)
        micro = {k: data.batch[k][rows].to(self.device) for k in LOG_PROB_KEYS}
        rec.micro(idx, micro["attention_mask"], self._rmpad(), sp, self._pad_to_longest())
        before = dist.collective_counts()
        lp, ent = forward_micro_batch(
            model,
            micro,
            use_remove_padding=self._rmpad(),
            sp_group=self.sp_group if sp > 1 else None,
            temperature=temperature,
            calculate_entropy=calculate_entropy,
            chunked=self.s.chunked_logprob,
            pad_to_longest=self._pad_to_longest(),
        )
        rec.forward(before, sp)
        return lp, ent

    # ---- update ---------------------------------------------------------------------------------------------------
    @register(make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update of this DP rank's rows. Mirrors DataParallelPPOActor.update_policy (legacy) and
        TrainingWorker.train_mini_batch + FSDPEngine.forward_backward_batch (engine)."""
        from labkit.rl.actor_update import run_update

        return self._measured(lambda: run_update(self, data))

    def _resident_bytes(self) -> int:
        """Bytes of this rank's live model states: local shards of actor and ref params, grads, Adam states."""
        tensors = [p for m in (self.model, self.ref) for p in m.parameters()]
        tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
        tensors += [v for state in self.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in local if t.numel() > 1)

    def _measured(self, call):
        """``call()``; with ``measure_memory`` its record gets ``bytes_measured``: the live model states plus the
        allocator's peak above them during the call."""
        if not self.s.measure_memory:
            return call()
        from labkit.model.allocation_meter import AllocationMeter

        resident = self._resident_bytes()
        with AllocationMeter() as meter:
            out = call()
        self.records[-1]["extra"]["bytes_measured"] = resident + meter.peak_bytes
        return out
