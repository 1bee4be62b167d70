"""The Megatron backend's step-1 checks on micro-batch counts, as pure arithmetic: verl's VPP assert and megatron-core's
interleaved-schedule checks, with the exact messages.

Mirrors ``verl/workers/engine/megatron/transformer_impl.py: MegatronEngine.forward_backward_batch`` (0.9.1),
``verl/workers/actor/megatron_actor.py: MegatronPPOActor.forward_backward_batch`` (0.7.1),
``megatron/core/model_parallel_config.py: ModelParallelConfig.__post_init__`` (the default G) and
``megatron/core/pipeline_parallel/schedules.py: forward_backward_pipelining_with_interleaving`` (megatron-core 0.16.1).
G is ``microbatch_group_size_per_vp_stage``.
"""

from __future__ import annotations

from labkit.rules.megatron_rules import Verdict, mod_text, until_first


def group_size(pp: int, microbatch_group_size_per_vp_stage: int | None) -> int:
    """G: ``microbatch_group_size_per_vp_stage``, PP when unset (``ModelParallelConfig.__post_init__``)."""
    return pp if microbatch_group_size_per_vp_stage is None else microbatch_group_size_per_vp_stage


def num_batches_divided_by(pp: int, vpp: int | None, g: int | None) -> int | None:
    """What verl rounds the dynamic micro-batch count to and asserts against: G when VPP > 1, else None."""
    return group_size(pp, g) if vpp is not None and vpp > 1 else None


def vpp_micro_batch_check(count: int, divided_by: int | None, profile: str = "engine") -> Verdict:
    """verl's assert that the micro-batch count is a multiple of G under VPP (M21): 0.9.1
    ``MegatronEngine.forward_backward_batch``; 0.7.1 ``MegatronPPOActor.forward_backward_batch`` (dynamic only).
    verl formats the list of micro-batches itself into the message; labkit writes ``<k micro-batches>``."""
    name = "num_batches_divided_by" if profile == "engine" else "microbatch_group_size_per_vp_stage"
    g = divided_by or 1
    return Verdict(
        "M21",
        divided_by is not None and count % divided_by != 0,
        "AssertionError",
        f"micro_batches <{count} micro-batches> must be divisible by {name} {g} for megatron backend",
        (f"micro-batches = {count}", mod_text(count, g)),
    )


def interleaved_schedule_checks(count: int, pp: int, vpp: int | None, g: int | None) -> list[Verdict]:
    """megatron-core's interleaved 1F1B (PP > 1 with a VPP size): G in [PP, Mμ] (M22), then the remainder Mμ % G is
    0 or >= PP (M23). Nothing is checked without interleaving."""
    if not (pp > 1 and vpp is not None):
        return []
    G = group_size(pp, g)
    rem = count % G
    return until_first(
        [
            Verdict(
                "M22",
                G > count or G < pp,
                "ValueError",
                "The number of contiguous micro-batches in a virtual pipeline stage"
                f"should range in [PP={pp} , M={count}]",
                (f"G = microbatch_group_size_per_vp_stage = {G}", f"need PP <= G <= M: {pp} <= {G} <= {count}"),
            ),
            Verdict(
                "M23",
                0 < rem < pp,
                "RuntimeError",
                "The remainder of M (the total micro-batches) divided by N (number of contiguous micro-batches in a "
                "virtual pipeline stage) should be 0, or larger than or equal to the pipeline-parallel size, but it is "
                f"{rem}. Otherwise, it introduces dependency bubbles in the pipeline and reduces throughput.",
                (f"M % G = {count} % {G} = {rem}", f"PP = {pp}"),
            ),
        ]
    )


def static_micro_batches(rows: int, micro: int) -> int:
    """Micro-batches of the 0.9.1 engine's static path (rows / m; E30 has checked it divides) and of 0.7.1's
    ``split(m)`` (ceil: the last one may be short)."""
    return -(-rows // micro)


def dynamic_group_check(pp: int, vpp: int | None, g: int | None) -> Verdict | None:
    """M22 for a dynamic pass, whose micro-batch count depends on the lengths: it is rounded up to a multiple of G
    (VPP > 1), so only G < PP is certain. The count in the message is written ``<dynamic>``."""
    if not (pp > 1 and vpp is not None):
        return None
    G = group_size(pp, g)
    return Verdict(
        "M22",
        G < pp,
        "ValueError",
        f"The number of contiguous micro-batches in a virtual pipeline stageshould range in [PP={pp} , M=<dynamic>]",
        (f"G = microbatch_group_size_per_vp_stage = {G}", f"G {'<' if G < pp else '>='} PP = {pp}"),
    )
