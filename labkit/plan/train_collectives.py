"""The collectives of one micro-batch's pass on a train mesh: FSDP's parameter gathers and Ulysses all-to-alls, or
Megatron's TP/SP, CP and pipeline P2P on the rank's stage (``labkit.plan.megatron_passes``), and the engine's metric
reductions; shared by the forward-only stages and the updates (``labkit.plan.train_stages``, ``update_batches``).

Mirrors verl/workers/engine_workers.py: TrainingWorker._postprocess_output (engine metrics) and the FSDP/Ulysses
forward of verl/workers/actor/dp_actor.py.
"""

from __future__ import annotations

from labkit.plan.context import Ctx
from labkit.plan.megatron_passes import forward_collectives, megatron_coords
from labkit.plan.roles import Params

# engine (0.9.1) TrainingWorker._postprocess_output, once per forward-only call and per update mini-batch
ENGINE_METRIC_COLLS = {"all_reduce(avg):loss": 1, "all_gather_object(metrics)": 1}


def _forward_colls(n_micro: int, sp: int, slice_sp: int) -> dict[str, int]:
    out = {"all_gather(params)": n_micro}
    if sp > 1:  # the attention all-to-all runs over the mesh's SP group
        out["all_to_all(ulysses)"] = n_micro
        if slice_sp > 1:  # gather_outputs_and_unpad only where the rows were sliced
            out["all_gather(ulysses_outputs)"] = n_micro
    return out


def pass_collectives(ctx: Ctx, p: Params, rank: int, backward: bool = False) -> dict[str, int]:
    """One micro-batch's forward (and backward) collectives on ``rank``: FSDP's gathers and Ulysses all-to-alls, or
    Megatron's TP/SP, CP and pipeline P2P on the rank's stage (``labkit.plan.megatron_passes``)."""
    if not p.megatron:
        return _forward_colls(1, p.sp, p.slice_sp)
    layout = ctx.geo.parallel
    stage = megatron_coords(layout, rank)["pp"]
    out = forward_collectives(layout, stage)
    if backward:
        add_counts(out, forward_collectives(layout, stage, backward=True))
    return out


def add_counts(a: dict[str, int], b: dict[str, int], times: int = 1) -> None:
    """Add ``b``'s non-zero counts, ``times`` over, into ``a`` (collective name -> calls)."""
    for k, v in b.items():
        if v:
            a[k] = a.get(k, 0) + v * times
