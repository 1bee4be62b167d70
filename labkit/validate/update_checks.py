"""The update passes of step 1, one per profile: the legacy ``update_policy`` / ``update_critic`` (``DataProto.split``
into M' mini-batches, ragged allowed: S1, S2 and their loss weights) and the engine's
``TrainingWorker.train_mini_batch`` (E28, E29, then static E30 per mini-batch). ``fsdp_step`` and
``megatron_step`` run them for the actor and the critic.
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.validate.micro_checks import Split, padded_width_budget
from labkit.validate.snapshot import AE, SILENT, STEP1, VE, Recorder, Snap, mod


def legacy_update_checks(
    rec: Recorder, s: Snap, rows: int, Mp: int, micro: int | None, budget: tuple | None, role: str
) -> None:
    """Legacy update_policy/update_critic: data.split(M') mini-batches (X2, S1), then the token budget
    (``budget``: key, value, sp, stage; E31) or split(m), and the weight of a short last mini-batch (S2)."""
    where = (
        "verl/workers/actor/dp_actor.py: DataParallelPPOActor.update_policy"
        if role == "actor"
        else "verl/workers/critic/dp_critic.py: DataParallelPPOCritic.update_critic"
    )
    if rec.add(
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
        padded_width_budget(rec, s, *budget, role)
    minis = Split(rows, Mp)
    rec.add(
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
            rec.add(
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
    rec.add(
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


def engine_update_checks(rec: Recorder, s: Snap, M: int, D: int, micro: int | None, dyn: bool, role: str) -> int | None:
    """Engine TrainingWorker.train_mini_batch: E28, E29, then static E30 per mini-batch; returns the mini size."""
    Mn, rows = M * s.rollout_n, s.samples // D
    where = "verl/workers/engine_workers.py: TrainingWorker.train_mini_batch"
    if rec.add(
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
    if rec.add(
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
        rec.add(
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
