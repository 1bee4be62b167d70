"""Micro- and mini-batch checks of the first step's forward and update passes, per profile: the dynamic token
budget (E31), static forward micro-batching (legacy ragged ``DataProto.split``, engine E30), the legacy update's
mini-batches and their loss weights (silent S-codes) and the engine's ``train_mini_batch`` (E28, E29, E30).
``labkit.validate.first_step`` calls them stage by stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.rules.catalogue import message
from labkit.rules.geometry import ceil_div
from labkit.validate.snapshot import AE, ERROR, NOTICE, SILENT, STEP1, VE, Run, Snap, mod

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


def budget_check(run: Run, s: Snap, key: str, tok: int, sp: int, stage: str, role: str) -> None:
    """E31: the dynamic token budget (x sp) against the padded width (legacy) or the longest row (engine)."""
    budget = tok * sp
    where = f"{SEQ}: rearrange_micro_batches ({stage})"
    arith = [f"max_token_len = {key} x {'CP' if s.megatron else 'sp'} = {tok} x {sp} = {budget}"]
    if s.legacy:
        arith.append(
            f"padded width = prompt_length + response_length = {s.prompt_length} + {s.response_length} = {s.width}"
        )
        run.add(
            budget < s.width,
            "E31",
            AE,
            message("E31", budget=budget, longest=s.width),
            STEP1,
            where,
            arith,
            "Legacy micro-batching sees padded rows, so the budget must cover the full padded width.",
            role=role,
        )
        return
    longest, sev = (s.max_seq_len, ERROR) if s.max_seq_len is not None else (s.width, NOTICE)
    arith.append(
        f"longest row = {longest}"
        if s.max_seq_len is not None
        else f"longest possible row = {s.prompt_length} + {s.response_length} = {s.width}"
    )
    expl = (
        "The budget must hold the longest row (prompt + response tokens)."
        if s.max_seq_len is not None
        else f"Fires only if some row is longer than {budget} tokens (the longest possible row has {s.width})."
    )
    run.add(
        budget < longest,
        "E31",
        AE,
        message("E31", budget=budget, longest=f"tensor({longest})"),
        STEP1,
        where,
        arith,
        expl,
        sev,
        role=role,
    )


def static_forward_checks(run: Run, s: Snap, rows: int, micro: int | None, key: str, stage: str, role: str) -> None:
    """Static forward-only micro-batching: legacy DataProto.split (ragged allowed), engine E30."""
    if s.legacy:
        where = f"verl/workers/actor/dp_actor.py: DataParallelPPOActor.compute_log_prob ({stage})"
        if run.add(
            micro is None,
            "X3",
            "TypeError",
            "'NoneType' object cannot be interpreted as an integer",
            STEP1,
            where,
            [f"{key} = None"],
            "No micro-batch size reaches the worker (its use_dynamic_bsz is off).",
            role=role,
        ):
            return
        if run.add(
            micro == 0,
            "X2",
            VE,
            "range() arg 3 must not be zero",
            STEP1,
            where,
            [f"{key} = 0"],
            "The deprecated global size floor-divided to 0 per GPU, and DataProto.split(0) fails.",
            role=role,
        ):
            return
        pieces = Split(rows, micro)
        run.add(
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
        return
    where = f"verl/workers/engine/utils.py: prepare_micro_batches ({stage})"
    if run.add(
        micro is None,
        "X3",
        "TypeError",
        "unsupported operand type(s) for *: 'int' and 'NoneType'",
        STEP1,
        where,
        [f"{key} = None"],
        "No per-GPU micro-batch size reaches the engine (its use_dynamic_bsz is off).",
        role=role,
    ):
        return
    run.add(
        rows % micro != 0,
        "E30",
        AE,
        message("E30"),
        STEP1,
        where,
        [f"rows per rank = {rows}", mod(rows, micro)]
        + (
            [f"{stage}: {rows} rows / {micro} per micro-batch = {rows // micro} micro-batches of {micro}"]
            if rows % micro == 0
            else []
        ),
        "Engine static micro-batching needs rows per rank divisible by the micro size.",
        role=role,
    )


def legacy_update_checks(
    run: Run, s: Snap, rows: int, Mp: int, micro: int | None, budget: tuple | None, role: str
) -> None:
    """Legacy update_policy/update_critic: data.split(M') mini-batches, then split(m) or token budget."""
    where = (
        "verl/workers/actor/dp_actor.py: DataParallelPPOActor.update_policy"
        if role == "actor"
        else "verl/workers/critic/dp_critic.py: DataParallelPPOCritic.update_critic"
    )
    if run.add(
        Mp == 0,
        "X2",
        VE,
        "range() arg 3 must not be zero",
        STEP1,
        where,
        [f"M' = {Mp}"],
        "The normalised mini-batch is 0 and DataProto.split(0) fails.",
        role=role,
    ):
        return
    if budget is not None:
        budget_check(run, s, *budget, role)
    minis = Split(rows, Mp)
    run.add(
        rows % Mp != 0,
        "S1",
        None,
        f"{role} update: {rows} rows per rank split into mini-batches {minis.describe()} (last one ragged)",
        STEP1,
        where,
        [f"mini-batches per epoch = ceil({rows} / {Mp}) = {len(minis)}", mod(rows, Mp)],
        "Legacy verl floors M' and never checks (B x n / D) % M'; the last optimizer step sees fewer rows.",
        SILENT,
        role=role,
    )
    if budget is not None or not micro:
        if budget is not None and rows % Mp:
            run.add(
                True,
                "S2",
                None,
                f"last mini-batch of {minis.last} rows is weighted {minis.last}/{Mp} of a full one",
                STEP1,
                where,
                [f"loss scale = rows / M' = {minis.last} / {Mp}"],
                "Dynamic micro-batches scale each loss by rows/M', so the short mini-batch is under-weighted.",
                SILENT,
                role=role,
            )
        return
    GA = Mp // micro
    last = Split(minis.last, micro)
    run.add(
        rows % Mp != 0,
        "S2",
        None,
        f"last mini-batch: {len(last)} micro-batches ({last.describe()}) each scaled 1/GA = 1/{GA}",
        STEP1,
        where,
        [f"GA = {Mp} // {micro} = {GA}", f"last mini-batch weight = {len(last)}/{GA} of a full one"]
        if rows % Mp
        else [f"GA = {Mp} // {micro} = {GA}"],
        "Static micro-batches always scale by 1/GA, so a short mini-batch contributes a smaller gradient.",
        SILENT,
        role=role,
    )


def engine_update_checks(run: Run, s: Snap, M: int, D: int, micro: int | None, dyn: bool, role: str) -> int | None:
    """Engine TrainingWorker.train_mini_batch: E28, E29, then static E30 per mini-batch; returns the mini size."""
    Mn, rows = M * s.rollout_n, s.samples // D
    where = "verl/workers/engine_workers.py: TrainingWorker.train_mini_batch"
    if run.add(
        Mn % D != 0,
        "E28",
        AE,
        message("E28", mini_batch_size=Mn, dp_size=D),
        STEP1,
        where,
        [f"mini_batch_size = {M} x {s.rollout_n} = {Mn}", mod(Mn, D)],
        "The engine requires the global mini-batch M x n to split evenly over the DP ranks.",
        role=role,
    ):
        return None
    mini = Mn // D
    if run.add(
        rows % mini != 0,
        "E29",
        AE,
        message("E29", rows=rows, mini=mini),
        STEP1,
        "verl/utils/tensordict_utils.py: make_iterator",
        [f"mini per rank = {Mn} / {D} = {mini}", mod(rows, mini)],
        "Each rank's rows must be a whole number of mini-batches.",
        role=role,
    ):
        return None
    if not dyn and micro is not None:
        run.add(
            mini % micro != 0,
            "E30",
            AE,
            message("E30"),
            STEP1,
            f"verl/workers/engine/utils.py: prepare_micro_batches ({role} update)",
            [f"mini per rank = {mini}", mod(mini, micro)]
            + ([f"GA = {mini} // {micro} = {mini // micro}"] if mini % micro == 0 else []),
            "Engine static micro-batching needs the per-rank mini-batch divisible by the micro size.",
            role=role,
        )
    return mini
