"""The forward-only passes of step 1 (compute_log_prob, compute_ref_log_prob, compute_values) as two rule lists,
one per micro-batching mode: dynamic (the token budget E31, then Megatron's group check) and static (legacy
``DataProto.split``, the engine's ``prepare_micro_batches`` E30, then Megatron's pipeline checks). Mirrors
``DataParallelPPOActor.compute_log_prob`` / ``DataParallelPPOCritic.compute_values`` (legacy), the engine's
``TrainingWorker`` forward (0.9.1) and ``megatron_actor.py`` (0.7.1).
"""

from __future__ import annotations

from labkit.validate.megatron_step import dynamic_pipeline, engine_static_pipeline, legacy_megatron_forward
from labkit.validate.micro_checks import engine_forward, longest_row_budget, padded_width_budget, split_forward
from labkit.validate.rulebook import ENGINE, FSDP, LEGACY, rule, run_rules
from labkit.validate.snapshot import Recorder, Snap
from labkit.validate.step_state import Pass


@rule("E31", when=LEGACY)
def padded_budget(rec: Recorder, s: Snap, p: Pass) -> None:
    padded_width_budget(rec, s, p.budget_key, p.budget, p.sp, p.stage, p.role)


@rule("E31", when=ENGINE)
def row_budget(rec: Recorder, s: Snap, p: Pass) -> None:
    longest_row_budget(rec, s, p.budget_key, p.budget, p.sp, p.stage, p.role)


@rule("X3 X2 S3", when=LEGACY & FSDP)
def legacy_split(rec: Recorder, s: Snap, p: Pass) -> None:
    split_forward(rec, s, p.rows, p.micro, p.micro_key, p.stage, p.role)


@rule("X3 E30", when=ENGINE)
def engine_static(rec: Recorder, s: Snap, p: Pass) -> None:
    engine_forward(rec, s, p.rows, p.micro, p.micro_key, p.stage, p.role)


DYNAMIC_FORWARD = (padded_budget, row_budget, dynamic_pipeline)
STATIC_FORWARD = (legacy_split, engine_static, engine_static_pipeline, legacy_megatron_forward)


def forward_pass(rec: Recorder, s: Snap, p: Pass) -> None:
    """The checks of one forward-only pass, in the order the worker runs them."""
    run_rules(DYNAMIC_FORWARD if p.dynamic else STATIC_FORWARD, rec, s, p)
