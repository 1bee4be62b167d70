"""The DP dispatch of one worker call at step 1: ``make_nd_compute_dataproto_dispatch_fn`` cuts the B x n rows into
equal chunks, one per DP rank, without padding — ``DataProto.chunk`` on the legacy workers (E26),
``chunk_tensordict`` on the engine workers (E27). v1's TransferQueue ``BatchMeta.chunk`` allows uneven chunks.
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.validate.snapshot import AE, STEP1, Recorder, Snap, mod

DISPATCH = "verl/single_controller/base/decorator.py: make_nd_compute_dataproto_dispatch_fn"
CHUNK = {"E26": "verl/protocol.py: DataProto.chunk", "E27": "verl/utils/tensordict_utils.py: chunk_tensordict"}


def dispatch(rec: Recorder, s: Snap, k: int, stage: str, role: str) -> bool:
    """The chunk check of one worker call over ``k`` DP ranks (nothing to check under v1); True when it raised."""
    if s.geo.loop == "v1":
        return False
    code = "E26" if s.legacy else "E27"
    return rec.add(
        s.samples % k != 0,
        code,
        AE,
        message(code, size=s.samples, chunks=k),
        STEP1,
        f"{DISPATCH} -> {CHUNK[code]} ({stage})",
        [mod(s.samples, k)],
        f"{stage}: the B x n rows are cut into {k} equal DP chunks without padding.",
        role=role,
    )
