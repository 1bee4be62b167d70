"""The micro-batching of one pass at step 1, one check per function: the dynamic token budget (E31: against the
padded width on the legacy workers, the longest row on the engine's), and static micro-batching of a forward-only
pass (legacy ragged ``DataProto.split``: X3, X2, S3; the engine's ``prepare_micro_batches``: X3, E30).
``forward_passes`` applies them to each forward pass, ``update_checks`` to the update passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.rules.catalogue import message
from labkit.rules.geometry import ceil_div
from labkit.validate.snapshot import AE, ERROR, NOTICE, SILENT, STEP1, VE, Recorder, Snap, mod

SEQ = "verl/utils/seqlen_balancing.py"


@dataclass(frozen=True)
class Split:
    """The pieces ``DataProto.split(size)`` cuts ``rows`` into, in closed form (a huge batch is never listed):
    ``rows // size`` full pieces, then a shorter last one when ``size`` does not divide ``rows``."""

    rows: int
    size: int

    def __len__(self) -> int:
        return ceil_div(self.rows, self.size)

    @property
    def last(self) -> int:
        """Rows of the last piece."""
        return self.rows - (len(self) - 1) * self.size if self.rows else 0

    def describe(self) -> str:
        """Compact '15 x 8' / '2 x 50 + 1 x 20' description of the piece sizes."""
        full, rest = divmod(self.rows, self.size)
        return " + ".join(f"{count} x {size}" for count, size in ((full, self.size), (1, rest)) if count and size)


def _budget_line(s: Snap, key: str, tok: int, sp: int) -> str:
    return f"max_token_len = {key} x {'CP' if s.megatron else 'sp'} = {tok} x {sp} = {tok * sp}"


def padded_width_budget(rec: Recorder, s: Snap, key: str, tok: int, sp: int, stage: str, role: str) -> None:
    """E31 on the legacy workers: the budget (x sp) must cover the padded width, prompt + response length."""
    budget = tok * sp
    rec.add(
        budget < s.width,
        "E31",
        AE,
        message("E31", budget=budget, longest=s.width),
        STEP1,
        f"{SEQ}: rearrange_micro_batches ({stage})",
        [
            _budget_line(s, key, tok, sp),
            f"padded width = prompt_length + response_length = {s.prompt_length} + {s.response_length} = {s.width}",
        ],
        "Legacy micro-batching sees padded rows, so the budget must cover the full padded width.",
        role=role,
    )


def longest_row_budget(rec: Recorder, s: Snap, key: str, tok: int, sp: int, stage: str, role: str) -> None:
    """E31 on the engine workers: the budget (x sp) must hold the longest row; without ``max_seq_len`` only the
    longest possible row is known, so a shortfall is a notice."""
    budget = tok * sp
    known = s.max_seq_len is not None
    longest = s.max_seq_len if known else s.width
    rec.add(
        budget < longest,
        "E31",
        AE,
        message("E31", budget=budget, longest=f"tensor({longest})"),
        STEP1,
        f"{SEQ}: rearrange_micro_batches ({stage})",
        [
            _budget_line(s, key, tok, sp),
            f"longest row = {longest}"
            if known
            else f"longest possible row = {s.prompt_length} + {s.response_length} = {s.width}",
        ],
        "The budget must hold the longest row (prompt + response tokens)."
        if known
        else f"Fires only if some row is longer than {budget} tokens (the longest possible row has {s.width}).",
        ERROR if known else NOTICE,
        role=role,
    )


def split_forward(rec: Recorder, s: Snap, rows: int, micro: int | None, key: str, stage: str, role: str) -> None:
    """Legacy static forward-only micro-batching: ``DataProto.split(m)`` (X3 no size, X2 a size of 0, S3 ragged)."""
    where = f"verl/workers/actor/dp_actor.py: DataParallelPPOActor.compute_log_prob ({stage})"
    if rec.add(
        micro is None, "X3", "TypeError", "'NoneType' object cannot be interpreted as an integer", STEP1, where,
        [f"{key} = None"], "No micro-batch size reaches the worker (its use_dynamic_bsz is off).", role=role,
    ):  # fmt: skip
        return
    if rec.add(
        micro == 0, "X2", VE, "range() arg 3 must not be zero", STEP1, where, [f"{key} = 0"],
        "The deprecated global size floor-divided to 0 per GPU, and DataProto.split(0) fails.", role=role,
    ):  # fmt: skip
        return
    pieces = Split(rows, micro)
    rec.add(
        rows % micro != 0,
        "S3",
        None,
        f"{stage}: {rows} rows per rank split into micro-batches {pieces.describe()} (last one ragged)",
        STEP1,
        where,
        [
            f"{stage}: {rows} rows / {micro} per micro-batch = {len(pieces)} micro-batches of {micro}"
            if rows % micro == 0
            else f"ceil({rows} / {micro}) = {len(pieces)} micro-batches: {pieces.describe()}"
        ],
        "DataProto.split allows a short last micro-batch; harmless for log-probs.",
        SILENT,
        role=role,
    )


def engine_forward(rec: Recorder, s: Snap, rows: int, micro: int | None, key: str, stage: str, role: str) -> None:
    """The engine's static forward-only micro-batching, ``prepare_micro_batches``: X3 no size, E30 rows % m."""
    where = f"verl/workers/engine/utils.py: prepare_micro_batches ({stage})"
    if rec.add(
        micro is None, "X3", "TypeError", "unsupported operand type(s) for *: 'int' and 'NoneType'", STEP1, where,
        [f"{key} = None"], "No per-GPU micro-batch size reaches the engine (its use_dynamic_bsz is off).", role=role,
    ):  # fmt: skip
        return
    whole = [f"{stage}: {rows} rows / {micro} per micro-batch = {rows // micro} micro-batches of {micro}"]
    rec.add(
        rows % micro != 0,
        "E30",
        AE,
        message("E30"),
        STEP1,
        where,
        [f"rows per rank = {rows}", mod(rows, micro)] + (whole if rows % micro == 0 else []),
        "Engine static micro-batching needs rows per rank divisible by the micro size.",
        role=role,
    )
