"""Where verl would stop during a step: the failure a planner stage raises, with verl's exception type and text."""

from __future__ import annotations

import builtins

from labkit.rules.catalogue import code_of, message
from labkit.rules.megatron_ranks import layout_check
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
    """The first check of megatron-core's ``initialize_model_parallel`` the layout fails (TP·PP·CP or ETP·EP·PP not
    dividing W, VPP without PP, ...), raised at worker init; ``labkit.rules.megatron_ranks.layout_check``."""
    bad = layout_check(layout)
    if bad is None:
        raise ValueError("megatron_mesh_failure: the layout passes megatron-core's checks")
    expert = "expert_tensor_model_pipeline_parallel" in bad.message  # M7's template would match it too
    code = "M9" if expert else code_of(bad.message) or "M7"
    return StageFailure(code, bad.error, bad.message)
