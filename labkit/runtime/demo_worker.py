"""A small importable worker for tests and notebooks: it reports what it received, all-reduces, raises or hangs.

Builds verl's two meshes in every rank: actor (dp, sp) registered as mesh "actor" and rollout (dp, infer_tp, infer_pp)
registered as mesh "rollout", with verl's is_collect rules (fsdp_workers.py: ActorRolloutRefWorker)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import torch

from labkit.runtime import dist, meshes, process_group
from labkit.runtime.dispatch import make_nd_compute_dataproto_dispatch_fn
from labkit.runtime.worker import Dispatch, Execute, Worker, register

if TYPE_CHECKING:  # imported by unpickling the first DataProto a rank receives
    from labkit.protocol.data_proto import DataProto


def add_one_to_ids(data: DataProto) -> DataProto:
    """A module-level function for DP_COMPUTE_PROTO_WITH_FUNC (functions travel by reference)."""
    return type(data).from_dict(tensors={"row_id": data.batch["row_id"] + 1})


class DemoWorker(Worker):
    """Tags every row it computes on with its rank, so the driver can see who received what."""

    def __init__(self, sp: int = 1, tp: int = 1, rdp: int = 1, pp: int = 1, fail_init_rank: int | None = None) -> None:
        super().__init__()
        if fail_init_rank == self.rank:
            raise RuntimeError(f"DemoWorker told to fail in __init__ on rank {self.rank}")
        self.actor_mesh = meshes.actor_mesh(sp)
        sp_rank = meshes.sp_rank(self.actor_mesh)
        self._register_dispatch_collect_info(
            "actor", dp_rank=meshes.dp_rank(self.actor_mesh), is_collect=sp_rank == 0, sp_rank=sp_rank
        )
        self.rollout_mesh = meshes.rollout_mesh(tp, rdp, pp)
        tp_rank = meshes.tp_rank(self.rollout_mesh)
        pp_rank = self.rollout_mesh.get_local_rank("infer_pp")
        self._register_dispatch_collect_info(
            "rollout",
            dp_rank=meshes.dp_rank(self.rollout_mesh),
            is_collect=tp_rank == 0 and pp_rank == 0,
            tp_rank=tp_rank,
        )
        self.register_group("sp", self.actor_mesh.get_group("sp"), "sp_rank", "actor")
        self.register_group("infer_tp", self.rollout_mesh.get_group("infer_tp"), "tp_rank", "rollout")

    @classmethod
    def check_world(cls, world_size: int, sp: int = 1, tp: int = 1, rdp: int = 1, pp: int = 1, **_: Any) -> None:
        """Mesh preconditions on the driver, before any process starts (E23 for the rollout mesh)."""
        meshes.check_actor_mesh(world_size, sp)
        meshes.check_rollout_mesh(world_size, tp, rdp, pp)

    def _tag(self, data: DataProto) -> DataProto:
        n = len(data)
        return type(data).from_dict(
            tensors={
                "row_id": data.batch["row_id"].clone(),
                "rank": torch.full((n,), self.rank),
                "seen_rows": torch.full((n,), n),
            }
        )

    # ---- one method per dispatch mode ---------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def echo(self, x: Any) -> dict:
        return {"rank": self.rank, "x": x}

    @register(Dispatch.ALL_TO_ALL)
    def per_rank(self, x: Any) -> tuple:
        return self.rank, x

    @register(Dispatch.DP_COMPUTE)
    def dp_item(self, x: Any) -> tuple:
        return self.rank, x

    @register(Dispatch.DP_COMPUTE_PROTO)
    def compute(self, data: DataProto) -> DataProto:
        return self._tag(data)

    @register(Dispatch.DP_COMPUTE_METRIC)
    def metric(self, data: DataProto) -> dict:
        return {"rank": self.rank, "rows": len(data)}

    @register(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def with_func(self, fn: Any, data: DataProto) -> DataProto:
        return fn(data)

    @register(make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def actor_compute(self, data: DataProto) -> DataProto:
        return self._tag(data)

    @register(make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout"))
    def rollout_compute(self, data: DataProto) -> DataProto:
        return self._tag(data)

    @register(Dispatch.DP_COMPUTE_PROTO, all_gather_group="infer_tp")
    def legacy_generate(self, data: DataProto) -> DataProto:
        """≤v0.5 rollout: rows all-gathered in the TP group before compute, output sliced back."""
        return self._tag(data)

    @register(Dispatch.DP_COMPUTE_PROTO, all_gather_group="sp")
    def legacy_sp_compute(self, data: DataProto) -> DataProto:
        """≤v0.5 actor with Ulysses: rows all-gathered in the SP group before compute, output sliced back."""
        return self._tag(data)

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def whoami(self) -> int:
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def echo_async(self, x: Any) -> dict:
        return {"rank": self.rank, "x": x}

    # ---- collectives, failures, hangs ---------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        """Sum of all ranks through a real all_reduce."""
        return float(dist.all_reduce(torch.tensor([float(self.rank)])).item())

    @register(Dispatch.ONE_TO_ALL)
    def info(self) -> dict:
        state = process_group.state()
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "backend": state.backend if state else None,
            "sp_group": meshes.group_ranks(self.actor_mesh.get_group("sp")),
            "tp_group": meshes.group_ranks(self.rollout_mesh.get_group("infer_tp")),
            "dispatch": dict(self._lk_dispatch),
        }

    @register(Dispatch.ONE_TO_ALL)
    def raise_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"DemoWorker told to raise on rank {rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def skip_all_reduce(self, skip_rank: int) -> float | None:
        """Every rank but `skip_rank` enters an all_reduce: the classic hang, which must end in an error."""
        if self.rank == skip_rank:
            return None
        return float(dist.all_reduce(torch.ones(1)).item())

    @register(Dispatch.ONE_TO_ALL)
    def raw_skip_all_reduce(self, skip_rank: int) -> float | None:
        """As skip_all_reduce, through a raw torch.distributed all_reduce (not labkit.runtime.dist's guarded one), as code
        that calls torch directly: it ends at the group's timeout, and leaves the process group out of step."""
        if self.rank == skip_rank:
            return None
        t = torch.ones(1)
        torch.distributed.all_reduce(t)
        return float(t.item())

    @register(Dispatch.ONE_TO_ALL)
    def stuck_in_collective(self, rank: int, seconds: float) -> int:
        """Rank `rank` blocks in a collective that ignores timeouts (as a wedged NCCL kernel): the driver's watchdog
        must name it."""
        if self.rank == rank:
            with dist.guarded("all_reduce", count=False):
                time.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def exit_on(self, rank: int, code: int) -> int:
        """Rank `rank` leaves at once with `code` (os._exit: no cleanup, no answer), as a crashing extension would."""
        if self.rank == rank:
            os._exit(code)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def late_all_reduce(self, late_rank: int, seconds: float) -> float:
        """Rank `late_rank` sleeps `seconds` before the all_reduce its peers are already waiting in (a fault test kills
        it meanwhile: its peers are then in the collective)."""
        if self.rank == late_rank:
            time.sleep(seconds)
        return float(dist.all_reduce(torch.ones(1)).item())

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def start_child(self, seconds: float) -> int:
        """Start a child process that sleeps (as a rank's own helper would) and return its pid."""
        import subprocess

        return subprocess.Popen(["sleep", str(seconds)]).pid
