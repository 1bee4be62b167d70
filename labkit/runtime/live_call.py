"""A worker-group call on the driver: the future a call returns (``LiveFuture``), the ``wg.<method>`` attribute that
starts one (``BoundMethod``) and the records a finished call leaves in the group's live StepTrace
(``record_call``). Mirrors verl/single_controller/ray/base.py: func_generator and verl/protocol.py: DataProtoFuture
(materialised on the driver)."""

from __future__ import annotations

import weakref
from typing import Any

from labkit.runtime.dispatch import collected_ranks
from labkit.runtime.worker import Dispatch, MethodSpec
from labkit.trace import RankRecord, StageRecord

_DP_MODES = (
    Dispatch.DP_COMPUTE,
    Dispatch.DP_COMPUTE_PROTO,
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
    Dispatch.DP_COMPUTE_METRIC,
)


class LiveFuture:
    """A dispatched call not yet collected (register(..., blocking=False)); get() waits, records, collects.

    Plays the role of verl/protocol.py: DataProtoFuture, materialised on the driver."""

    def __init__(
        self,
        wg: Any,
        handle: Any,
        ranks: list[int],
        method: str,
        spec: MethodSpec,
        collect_fn: Any,
        pad: int,
        stage: str,
        global_rows: int,
    ) -> None:
        self.wg, self.handle, self.ranks, self.method, self.spec = wg, handle, ranks, method, spec
        self.collect_fn, self.pad, self.stage, self.global_rows = collect_fn, pad, stage, global_rows
        self._done, self._value = False, None

    def get(self) -> Any:
        if not self._done:
            self._value, self._done = self.wg._finish(self), True
        return self._value


class BoundMethod:
    """`wg.<method>(...)`: dispatch → run on the ranks → collect (the role of verl's func_generator)."""

    def __init__(self, wg: Any, name: str, spec: MethodSpec) -> None:
        self._wg, self.__name__, self.spec = weakref.proxy(wg), name, spec

    def __call__(self, *args: Any, _stage: str | None = None, **kwargs: Any) -> Any:
        return self._wg.call(self.__name__, *args, _stage=_stage, **kwargs)

    def __repr__(self) -> str:
        return f"<registered {self.__name__} [{self.spec.mode_name}, {self.spec.execute_mode.value}]>"


def record_call(wg: Any, fut: LiveFuture, records: list[dict]) -> None:
    """Append one RankRecord per executed rank (and the stage) to the group's live trace."""
    collected = collected_ranks(fut.spec, wg)
    per_rank = None
    for rank, rec in zip(fut.ranks, records):
        rec = dict(rec or {})
        dp_rank = rec.pop("dp_rank", None)
        if dp_rank is None and fut.spec.dispatch_mode in _DP_MODES:
            dp_rank = rank
        extra = {k: rec.pop(k) for k in ("recv_rows", "recv_tokens", "out_rows", "out_tokens", "elapsed_s")}
        extra.update(method=fut.method, mode=fut.spec.mode_name, collected=collected[rank])
        wg.trace.ranks.append(
            RankRecord(
                stage=fut.stage,
                rank=rank,
                dp_rank=dp_rank,
                tp_rank=rec.get("tp_rank"),
                sp_rank=rec.get("sp_rank"),
                rows=rec["rows"],
                tokens=rec["tokens"],
                collectives=rec.get("collectives", {}),
                extra=extra,
            )
        )
        per_rank = extra["recv_rows"] if per_rank is None or per_rank == extra["recv_rows"] else -1
    if fut.stage not in wg.trace.stage_names():
        wg.trace.stages.append(
            StageRecord(
                name=fut.stage,
                title=f"{fut.method} [{fut.spec.mode_name}]",
                global_rows=fut.global_rows,
                per_rank_rows=None if per_rank in (None, -1) else per_rank,
                formula=f"dispatched by {fut.spec.mode_name} over {wg.world_size} ranks",
                where="labkit.runtime.worker_group",
            )
        )
