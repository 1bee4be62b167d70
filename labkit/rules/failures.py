"""Where verl would stop during a step: the failure a planner stage raises, with verl's exception type and text."""

from __future__ import annotations

import builtins

from labkit.rules.catalogue import message
from labkit.rules.parallel_layout import ParallelLayout


class StageFailure(Exception):
    """verl would stop at this stage: carries verl's exception type and exact message (with its E-code)."""

    def __init__(self, code: str, exc_type: str, message: str) -> None:
        super().__init__(message)
        self.code, self.exc_type, self.message = code, exc_type, message

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "exc_type": self.exc_type, "message": self.message}

    def as_exception(self) -> Exception:
        """The builtin exception verl raises (``AssertionError``, ``ValueError``, ...), with verl's text."""
        return getattr(builtins, self.exc_type)(self.message)


def fail_chunk(n: int, k: int) -> StageFailure:
    """E26: ``DataProto.chunk(k)`` on a length not divisible by k (no auto-padding). Mirrors verl/protocol.py."""
    return StageFailure("E26", "AssertionError", message("E26", size=n, chunks=k))


def mesh_failure(W: int, sp: int) -> StageFailure:
    """X4 (labkit code, as labkit.validate.report): torch cannot build the Ulysses mesh (W // sp, sp) when W % sp != 0."""
    return StageFailure(
        "X4",
        "RuntimeError",
        f"torch init_device_mesh(mesh_shape=({W // sp}, {sp}), mesh_dim_names="
        f"['dp', 'sp']) cannot cover a world of {W} ranks (exact text depends on the torch version)",
    )


def megatron_mesh_failure(layout: ParallelLayout) -> StageFailure:
    """megatron-core cannot lay out W ranks when TP·PP·CP does not divide W (``parallel_state.py:
    initialize_model_parallel``, RuntimeError at worker init)."""
    size = layout.tp * layout.pp * layout.cp
    return StageFailure("M7", "RuntimeError", message("M7", world_size=layout.world_size, model_size=size))
