"""verl's device meshes inside a rank and this rank's place in its groups: the actor's (dp, sp), the rollout's
(dp, infer_tp, infer_pp), each group held to the collective timeout of ``labkit.runtime.process_group``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from labkit.runtime.process_group import DEFAULT_COLLECTIVE_TIMEOUT_S, set_group_timeout, state

if TYPE_CHECKING:  # imported inside the mesh builders: device_mesh is slow to import
    from torch.distributed.device_mesh import DeviceMesh


def check_actor_mesh(world_size: int, sp: int) -> None:
    """The actor mesh (dp, sp) needs W % sp == 0 (verl builds it as (W // sp, sp))."""
    if sp < 1 or world_size % sp != 0:
        raise ValueError(
            f"world size {world_size} is not divisible by ulysses_sequence_parallel_size {sp}: "
            f"the actor mesh (dp, sp) needs world_size % sp == 0"
        )


def check_rollout_mesh(world_size: int, tp: int, rdp: int = 1, pp: int = 1) -> None:
    """E23, verl's text. Mirrors verl/workers/fsdp_workers.py: ActorRolloutRefWorker._build_rollout."""
    infer_world_size = tp * rdp * pp
    if world_size % infer_world_size != 0:
        raise AssertionError(
            f"rollout world_size: {world_size} is not divisible by infer_world_size: {infer_world_size}"
        )


def device_type() -> str:
    """Device type for meshes of this rank: "cuda" under NCCL, else "cpu" (gloo, also when ranks share a GPU)."""
    current = state()
    return "cuda" if current is not None and current.backend == "nccl" else "cpu"


def actor_mesh(sp: int = 1) -> DeviceMesh:
    """Ulysses mesh (dp=W//sp, sp) named ("dp", "sp"): rank r has dp_rank r // sp, sp_rank r % sp."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    check_actor_mesh(world, sp)
    return _short_timeouts(init_device_mesh(device_type(), (world // sp, sp), mesh_dim_names=("dp", "sp")))


def rollout_mesh(tp: int = 1, rdp: int = 1, pp: int = 1) -> DeviceMesh:
    """Rollout mesh (dp, infer_tp=tp*rdp, infer_pp=pp) as verl's _build_rollout; E23 when W is not divisible."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    check_rollout_mesh(world, tp, rdp, pp)
    infer_tp = tp * rdp
    return _short_timeouts(
        init_device_mesh(
            device_type(), (world // (infer_tp * pp), infer_tp, pp), mesh_dim_names=("dp", "infer_tp", "infer_pp")
        )
    )


def _short_timeouts(mesh: Any) -> Any:
    """Give every group of a new mesh the collective timeout (subgroups are created with torch's long default)."""
    current = state()
    for name in mesh.mesh_dim_names:
        set_group_timeout(mesh.get_group(name), current.timeout_s if current else DEFAULT_COLLECTIVE_TIMEOUT_S)
    return mesh


def dp_rank(mesh: DeviceMesh) -> int:
    """This rank's index along the mesh's "dp" dimension (actor and rollout meshes alike)."""
    return mesh.get_local_rank("dp")


def sp_rank(mesh: DeviceMesh) -> int:
    """This rank's index in its Ulysses SP group (actor mesh)."""
    return mesh.get_local_rank("sp")


def tp_rank(mesh: DeviceMesh) -> int:
    """This rank's index in its rollout TP group (rollout mesh dimension "infer_tp")."""
    return mesh.get_local_rank("infer_tp")


def group_rank(group: Any = None) -> int:
    """This rank's index inside `group` (None: the world)."""
    return dist.get_rank(group)


def group_size(group: Any = None) -> int:
    """Number of ranks in `group` (None: the world)."""
    return dist.get_world_size(group)


def group_ranks(group: Any = None) -> list[int]:
    """Global ranks of a process group (None: the world)."""
    if group is None:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(group)
