"""Claims of the second post about the forward and update passes: the log-prob flow with padding removal and
Ulysses, the mini-batch split of the update, and the loss factors of a micro-batch (claims p2-35 to p2-39).
"""

from __future__ import annotations

from labkit.balance.micro_batches import (
    rearrange_micro_batches,
    restore_dynamic_batch,
)
from labkit.rules.catalogue import message
from labkit.ui.seed_claims.probe import (
    BUDGET8,
    DYN,
    GSM,
    LEGACY,
    PROFILE,
    SEED8,
    V0,
    V1,
    A,
    first_error,
    trace,
)
from labkit.ui.seed_claims.record import Case, Checked, claim

GROUP = "the forward and update passes (post 2)"
BOTH = (LEGACY, V1)


def _padded_batch():
    """Three left-padded prompts with right-padded responses, as verl's rollout lays them out (ids, mask, pos)."""
    import torch

    from labkit.model.packing import compute_position_id_with_mask

    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0, 0]])
    ids = (torch.arange(1, mask.numel() + 1).reshape(mask.shape) * mask).long()
    return ids, mask, compute_position_id_with_mask(mask)


@claim("p2-35", GROUP, "F10", "all versions")
def logprob_flow() -> Checked:
    """compute_log_prob cuts micro-batches (dynamic or static); for each, unpad_input packs the real tokens,
    ulysses_pad pads and slices them over the SP ranks, the model runs, gather_outpus_and_unpad gathers and unpads,
    pad_input restores the shape; the outputs are concatenated and, when dynamic, put back in order."""
    import torch

    from labkit.model.packing import pack_micro_batch
    from labkit.model.ulysses import gather_outpus_and_unpad, ulysses_pad_and_slice_inputs

    ids, mask, pos = _padded_batch()
    packed = pack_micro_batch(ids, mask, pos)
    sp = 2
    slices = [ulysses_pad_and_slice_inputs(packed.input_ids, packed.position_ids, sp, r) for r in range(sp)]
    pad = slices[0][2]
    gathered = torch.cat([s[0] for s in slices], dim=1)  # what the SP all-gather returns to every rank
    restored = packed.pad_back(gathered.narrow(1, 0, gathered.size(1) - pad)[0].float())
    plan = rearrange_micro_batches(SEED8, BUDGET8, profile="legacy")
    outputs = [SEED8[i] for b in plan.indices for i in b]  # one value per row, in micro-batch order
    try:
        gather_outpus_and_unpad(gathered, gather_dim=1)
        old_name = "runs"
    except RuntimeError as exc:
        old_name = f"RuntimeError: {exc}"
    cases = [
        Case(
            "packed, padded, sliced over sp=2, gathered, unpadded, restored = the input",
            True,
            torch.equal(restored.long(), ids),
        ),
        Case(
            "dynamic micro-batch outputs restored to the input order",
            SEED8,
            restore_dynamic_batch(outputs, plan.indices),
        ),
        Case("gather_outpus_and_unpad (the name used) gathers and unpads", "runs", old_name, caveat=True),
    ]
    note = message("F10", tokens=packed.nnz, pad=pad, padded=packed.nnz + pad, sp=sp, restored=cases[0].holds)
    return cases, [note, f"the function is gather_outputs_and_unpad; the old name: {old_name}"]


@claim("p2-36", GROUP, "S1", "0.6–0.8, 0.9.1 v0")
def minis_by_chunk() -> Checked:
    """update_policy makes N / ppo_mini_batch_size mini-batches with data.chunk(num_mini_batches)."""
    cases = []
    for v in (LEGACY, V0):
        for M, m in ((20, 8), (25, 5)):
            over = (f"{A}.ppo_mini_batch_size={M}", f"{A}.ppo_micro_batch_size_per_gpu={m}")
            mini = M * 12 // 6
            err = first_error(v, *over)
            seen = f"error ({err[0]})" if err else trace(v, *over).summary["mini_batches"]
            want = [mini] * (120 // mini) if 120 % mini == 0 else "error"
            cases.append(
                Case(
                    f"120 rows per GPU, mini-batch {mini}: chunk(120 / {mini})",
                    want,
                    seen,
                    v,
                    match=lambda c, o: c == o or (c == "error" and str(o).startswith("error")),
                )
            )
    return cases, [f"[{LEGACY}] M=25: mini-batches {trace(LEGACY, *over).summary['mini_batches']} (split, ragged)"]


def _scale(version: str, batching: str, rows: int, mini: int, ga: int | None) -> float:
    from labkit.rl.algo import micro_batch_loss_scale

    return micro_batch_loss_scale(PROFILE[version], batching, rows, mini, ga)


@claim("p2-37", GROUP, "F9", "0.6–0.8, 0.9.1 v1")
def static_loss_over_ga() -> Checked:
    """With static micro-batches the loss is divided by the gradient accumulation steps."""
    cases = [
        Case("loss factor of a micro-batch (8 of 120 rows, GA 15)", 1 / 15, _scale(v, "static", 8, 120, 15), v)
        for v in BOTH
    ]
    return cases, [f"[{v}] " + message("F9", scale=trace(v).summary["loss_scale"]) for v in BOTH]


@claim("p2-38", GROUP, "F9", "0.6–0.8, 0.9.1 v1")
def dynamic_loss_share() -> Checked:
    """With dynamic micro-batches the loss is multiplied by len(micro_batch) / ppo_mini_batch_size."""
    cases = [
        Case(
            "loss factor of a 10-row micro-batch of a 120-row mini-batch",
            10 / 120,
            _scale(v, "dynamic", 10, 120, None),
            v,
        )
        for v in BOTH
    ]
    return cases, [f"[{LEGACY}] " + message("F9", scale=trace(LEGACY, *DYN).summary["loss_scale"])]


@claim("p2-39", GROUP, "F9", "0.6–0.8")
def share_weighting() -> Checked:
    """That dynamic factor weights each micro-batch's gradient by its share of the samples."""
    import torch

    from labkit.rl.algo import agg_loss

    tr = trace(LEGACY, *DYN, lengths=GSM)
    micros = [m.rows for m in tr.at("update_actor")[0].micro_batches]
    shares = sum(_scale(LEGACY, "dynamic", r, 120, None) for r in micros)
    gen = torch.Generator().manual_seed(0)
    loss = torch.rand(120, 64, generator=gen)
    resp = torch.randint(1, 65, (120,), generator=gen)
    mask = (torch.arange(64) < resp[:, None]).float()
    starts = [sum(micros[:i]) for i in range(len(micros))]
    parts = [slice(s, s + r) for s, r in zip(starts, micros)]
    legacy = sum(agg_loss(loss[p], mask[p], "token-mean", profile="legacy") * (p.stop - p.start) / 120 for p in parts)
    whole = agg_loss(loss, mask, "token-mean", profile="legacy")
    cases = [
        Case(f"the factors of the {len(micros)} micro-batches of one mini-batch add up to", 1.0, round(shares, 12)),
        Case(
            "the weighted micro-batch token means equal the mini-batch's token mean",
            True,
            bool(torch.isclose(legacy, whole, rtol=1e-6)),
            caveat=True,
        ),
    ]
    return cases, [
        f"weighted per-micro means {float(legacy):.6f} vs the token mean of the mini-batch {float(whole):.6f}"
    ]
