"""The planner's shared state: the step's batch geometry (``labkit.rules.geometry``), the sequence lengths, the
balanced order, and the stage errors found so far; plus the rank layouts of the actor and rollout meshes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.plan.megatron_passes import megatron_coords, trainer_dp_rank
from labkit.rules.catalogue import message
from labkit.rules.failures import StageFailure, fail_chunk, megatron_mesh_failure, mesh_failure
from labkit.rules.geometry import BatchGeometry, workload
from labkit.rules.megatron_ranks import layout_check
from labkit.rules.v1_loop import batch_meta_chunks


@dataclass
class Ctx:
    """One training step being planned: config, geometry, lengths, and what the stages found."""

    cfg: Any
    geo: BatchGeometry
    dispatch: str
    lengths: list[int] | None
    order: list[list[int]] | None = None  # sample indices per actor DP rank after _balance_batch
    errors: dict[str, dict[str, str]] = field(default_factory=dict)
    cache: dict[Any, Any] = field(default_factory=dict)
    workloads: list[int] | None = None  # verl's calculate_workload per sample
    rows: list[tuple[int, int] | None] | None = None  # v1: (prompt, session) of each batch row; None = padding

    def __post_init__(self) -> None:
        if self.lengths is not None:
            self.workloads = [workload(x) for x in self.lengths]

    @property
    def profile(self) -> str:
        return self.geo.profile

    @property
    def v1(self) -> bool:
        """Whether the step follows verl 0.9.1's v1 loop (``trainer.use_v1=true``)."""
        return self.geo.loop == "v1"

    @property
    def rows_name(self) -> str:
        """How the step's row count is written in formulas: B·n, or N′ (B·n plus v1's padding rows)."""
        return "N′" if self.v1 else "B·n"

    def get(self, path: str) -> Any:
        return self.cfg.get(path)

    def tokens(self, idx: list[int]) -> int | None:
        return None if self.lengths is None else self._sum("tok", self.lengths, idx)

    def workload(self, idx: list[int]) -> int | None:
        return None if self.workloads is None else self._sum("wl", self.workloads, idx)

    def _sum(self, kind: str, values: list[int], idx: list[int]) -> int:
        """Σ values[idx], memoised per index list (the ranks of one DP group share theirs: TP/CP/PP or SP ranks)."""
        hit = self.cache.get((kind, id(idx)))
        if hit is not None and hit[0] is idx:
            return hit[1]
        total = sum(map(values.__getitem__, idx))
        self.cache[(kind, id(idx))] = (idx, total)  # holding idx keeps its id from being reused
        return total

    def train_rank(self, rank: int, sp: int) -> tuple[int, int]:
        """(dp_rank, sp_rank) of a global rank on the training engine's layout: the Ulysses mesh (FSDP), or
        megatron-core's DP coordinate (sp_rank 0: Megatron has no Ulysses group)."""
        layout = self.geo.parallel
        if layout.is_megatron:
            if "megatron_layout_ok" not in self.cache:
                self.cache["megatron_layout_ok"] = layout_check(layout) is None
            if not self.cache["megatron_layout_ok"]:  # megatron-core stops at worker init: no rank gets rows
                raise megatron_mesh_failure(layout)
            return trainer_dp_rank(layout, rank), 0
        return actor_layout(rank, sp)

    def mesh_failure(self) -> StageFailure:
        """Why the training layout cannot be built: the Ulysses mesh (X4) or megatron-core's TP·PP·CP split."""
        layout = self.geo.parallel
        if layout.is_megatron:
            return megatron_mesh_failure(layout)
        return mesh_failure(self.geo.world_size, self.geo.ulysses_sp)

    def megatron_extra(self, rank: int) -> dict[str, Any]:
        """The rank's Megatron coordinates for its records (``{"megatron": {tp, cp, dp, pp}}``), {} under FSDP."""
        layout = self.geo.parallel
        return {"megatron": megatron_coords(layout, rank)} if layout.is_megatron else {}

    def dp_chunks(self, dp: int) -> list[list[int]]:
        """Sample indices per DP rank when the balanced batch is chunked into ``dp`` equal pieces (nd dispatch).

        Uneven: E26 (legacy ``DataProto.chunk``) or E27 (engine ``chunk_tensordict``); v1 dispatches
        TransferQueue ``BatchMeta.chunk`` slices, uneven allowed (``labkit.rules.v1_loop.batch_meta_chunks``)."""
        samples = self.geo.samples
        if self.v1:
            flat = [i for part in self.order for i in part] if self.order is not None else list(range(samples))
            out, start = [], 0
            for size in batch_meta_chunks(samples, dp):
                out.append(flat[start : start + size])
                start += size
            return out
        if samples % dp:
            if self.profile == "engine":  # 0.9.1 dispatches TensorDicts (tensordict_utils.py: chunk_tensordict)
                raise StageFailure("E27", "AssertionError", message("E27", size=samples, chunks=dp))
            raise fail_chunk(samples, dp)
        flat = [i for part in self.order for i in part] if self.order is not None else list(range(samples))
        size = samples // dp
        return [flat[r * size : (r + 1) * size] for r in range(dp)]


def actor_layout(rank: int, sp: int) -> tuple[int, int]:
    """(dp_rank, sp_rank) of a global rank in the Ulysses mesh (dp, sp), row-major as init_device_mesh builds it."""
    return rank // sp, rank % sp


def rollout_layout(rank: int, infer_tp: int, infer_pp: int) -> tuple[int, int, int]:
    """(dp_rank, tp_rank, pp_rank) in the rollout mesh (dp, infer_tp, infer_pp), row-major (``_build_rollout``)."""
    return rank // (infer_tp * infer_pp), (rank // infer_pp) % infer_tp, rank % infer_pp
