"""Hang risks of a config and its lengths, before any run: arithmetic on the planner's trace.

Three of verl's batch-size hangs can be predicted from the lengths each DP rank receives:
(a) dynamic micro-batching without the DP-wide MAX sync (the ``dp_group is None`` guard of verl 0.7.1's dp_actor,
issue #5750, fixed by PR #5591): ranks whose micro-batch counts differ issue different numbers of FSDP collectives;
(b) the MAX sync succeeds but a rank holds fewer rows than the synced count and fails ``assert num_micro_batches <=
num_groups`` while its peers wait (EasyR1 #11004; verl's equal dispatch prevents it, forks that dispatch unequal rows
meet it); (c) a micro or mini size normalised to 0 (legacy): ``split(0)``, which early verl looped on until OOM (#12,
#2490) and later verl rejects (X2). Mirrors verl/utils/seqlen_balancing.py: rearrange_micro_batches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from labkit.balance.micro_batches import plan_dp_micro_batches
from labkit.plan.step import plan
from labkit.rules.dp_sync import dp_group_passed
from labkit.rules.run import as_run

DYNAMIC_STAGES = ("old_log_prob", "ref_log_prob", "update_actor", "values", "update_critic")
FIX = {
    "a": "pass the DP group to rearrange_micro_batches so the micro-batch count is MAX-synced (verl PR #5591; "
    "0.8.0.dev syncs over the world group)",
    "b": "give every DP rank the same rows (verl's dispatch), or pad a light rank with dummy 1-row micro-batches up "
    "to the synced count (EasyR1 PR #11012)",
    "c": "set the *_per_gpu micro size (or a global size >= the DP size) so no size normalises to 0",
}


MIN_DRAWS = 8
"""Draws taken whatever the time budget (a probability over fewer says little)."""


@dataclass
class HangRisk:
    """One way this config and these lengths can hang: which hang, where, what triggers it, and the fix."""

    kind: str  # "a", "b" or "c"
    stage: str
    title: str
    trigger: str
    fix: str
    counts: list[int] | None = None  # micro-batches per DP rank without the sync (a) or after it (b)
    rows: list[int] | None = None
    probability: float | None = None
    arithmetic: list[str] = field(default_factory=list)
    draws: int | None = None
    """The drawn length sets ``probability`` was taken over."""

    def line(self) -> str:
        """The warning as one line."""
        chance = (
            f" (probability {self.probability:.0%} over {self.draws or 'the'} drawn length sets)"
            if self.probability is not None
            else ""
        )
        return f"hang ({self.kind}) at {self.stage}: {self.title}: {self.trigger}{chance}; fix: {self.fix}"


def unsynced_counts(per_rank: Sequence[Sequence[int]], budget: int, profile: str, width: int | None) -> list[int]:
    """Micro-batches each DP rank would cut alone (no MAX sync): k = min(rows, ceil(tokens / budget))."""
    plans = plan_dp_micro_batches(per_rank, budget, profile=profile, max_seq_len=width, dp_group=False)
    return [p.num_micro_batches for p in plans]


def rank_risks(
    per_rank: Sequence[Sequence[int]], budget: int, stage: str, profile: str = "legacy", width: int | None = None
) -> list[HangRisk]:
    """(a) and (b) for one dynamic micro-batching call: the lengths each DP rank holds and the token budget."""
    risks = []
    try:
        alone = unsynced_counts(per_rank, budget, profile, width)
    except (AssertionError, ValueError):  # verl raises on every rank alike (E31...): an error, not a hang
        return []
    rows = [len(r) for r in per_rank]
    tokens = [sum(r) for r in per_rank]
    arith = [f"dp_rank {r}: {rows[r]} rows, {tokens[r]} tokens, k = {alone[r]}" for r in range(len(rows))]
    # the engine hands rearrange_micro_batches its DP group, so the MAX sync always runs (labkit.rules.dp_sync)
    if len(set(alone)) > 1 and not dp_group_passed(profile):
        risks.append(
            HangRisk(
                "a",
                stage,
                "DP ranks cut different micro-batch counts; verl that skips the MAX sync (0.7.1 dp_actor, #5750) hangs",
                f"k per DP rank {alone} (budget {budget}): without the sync the heaviest rank issues "
                f"{max(alone) - min(alone)} more parameter all-gather(s) than the lightest and waits forever",
                FIX["a"],
                counts=alone,
                rows=rows,
                arithmetic=arith,
            )
        )
    synced = max(alone)
    light = [r for r, n in enumerate(rows) if n < synced]
    if light and profile == "legacy":  # engine: E35 is raised on every rank together (the count of groups is synced)
        risks.append(
            HangRisk(
                "b",
                stage,
                "after the MAX sync a light rank fails assert num_micro_batches <= num_groups",
                f"synced k = {synced} but dp_rank(s) {light} hold {[rows[r] for r in light]} rows",
                FIX["b"],
                counts=[synced] * len(rows),
                rows=rows,
                arithmetic=arith,
            )
        )
    return risks


def _stage_batches(trace: Any, stage: str) -> list[list[list[int]]]:
    """Per micro-batching call of a stage (one per mini-batch for an update), the sample ids each DP rank holds."""
    recs = [r for r in trace.at(stage) if not r.sp_rank]
    if not recs or not recs[0].micro_batches:
        return []
    calls: list[list[list[int]]] = []
    for r in recs:
        gas = r.extra.get("ga_per_mini") or [len(r.micro_batches)]
        pos = 0
        for j, ga in enumerate(gas):
            ids = [i for m in r.micro_batches[pos : pos + ga] for i in (m.indices or [])]
            pos += ga
            if len(calls) <= j:
                calls.append([])
            calls[j].append(ids)
    return calls


def trace_risks(trace: Any, lengths: Sequence[int], budgets: dict[str, int], width: int | None) -> list[HangRisk]:
    """(a), (b) on every dynamic stage of a planned step, and (c) wherever the plan meets split(0) (X2). The rows'
    lengths are the plan's own (``trace.row_lengths``: v1 reorders and pads them) when it has them."""
    out: list[HangRisk] = []
    lengths = trace.row_lengths if getattr(trace, "row_lengths", None) else lengths
    for stage, budget in budgets.items():
        for call in _stage_batches(trace, stage):
            per_rank = [[int(lengths[i]) for i in ids] for ids in call]
            for risk in rank_risks(
                per_rank, budget, stage, trace.profile, width if trace.profile == "legacy" else None
            ):
                if not any(o.kind == risk.kind and o.stage == risk.stage for o in out):
                    out.append(risk)
    for stage, err in (trace.summary.get("stage_errors") or {}).items():
        if err.get("code") in ZERO_SIZE:
            out.append(
                HangRisk(
                    "c",
                    stage,
                    "a size normalised to 0 per GPU reaches a split of size 0",
                    ZERO_SIZE[err["code"]],
                    FIX["c"],
                )
            )
    return out


# the errors of a size normalised to 0 that earlier verl met as an endless split(0) loop
ZERO_SIZE = {
    "X2": "early verl loops here without end while memory climbs, then OOMs (#12, #2490); later legacy verl raises X2",
    "E20": "the normalised actor mini-batch is 0: before verl PR #552 added this assert, update_policy looped in "
    "split(0) instead",
}


def stage_budgets(cfg: Any) -> tuple[dict[str, int], int]:
    """Token budget (× budget SP) of each dynamic stage of ``cfg``, and the rollout's padded width."""
    from labkit.plan.context import Ctx
    from labkit.plan.roles import params
    from labkit.rules.failures import StageFailure

    run = as_run(cfg)
    geo = run.geometry
    ctx = Ctx(cfg=run, geo=geo, dispatch="mesh", lengths=None)
    budgets = {}
    for stage in DYNAMIC_STAGES:
        if stage in ("values", "update_critic") and not run.need_critic:
            continue
        try:
            p = params(ctx, stage)
        except StageFailure:  # a mesh verl cannot build: the planner reports it as an error
            continue
        if p.dyn and p.budget:
            budgets[stage] = p.budget * p.budget_sp
    return budgets, geo.width


def config_risks(
    cfg: Any,
    lengths: Sequence[int] | str | None,
    *,
    draws: int = 64,
    seed: int = 0,
    trace: Any = None,
    time_budget_s: float | None = None,
) -> list[HangRisk]:
    """Hang risks of ``cfg`` with explicit lengths, or a length profile drawn ``draws`` times (probability =
    share of draws that trigger each risk); None: only (c), which needs no lengths (``trace``: ``plan(cfg)``
    when the caller has it already). ``time_budget_s``: stop drawing once it is spent (after ``MIN_DRAWS``); each
    risk says over how many draws its probability was taken. The engine syncs the count over its DP group: only (c)
    can happen there, and nothing is drawn. A config is resolved once, here; every draw's plan takes the run."""
    run = as_run(cfg)
    if lengths is None or dp_group_passed(run.profile):  # (a) and (b) are legacy's; (c) needs no lengths
        return trace_risks(trace if trace is not None else plan(run), [], {}, None)
    budgets, width = stage_budgets(run)
    if not budgets:  # no dynamic stage: only (c) can happen
        return trace_risks(plan(run, lengths if not isinstance(lengths, str) else None), [], {}, width)
    if not isinstance(lengths, str):
        trace = plan(run, lengths)
        return trace_risks(trace, list(lengths), budgets, width)
    geo = run.geometry
    hits: dict[tuple[str, str], list] = {}
    start, done = time.perf_counter(), 0
    for k in range(draws):
        if time_budget_s is not None and k >= MIN_DRAWS and time.perf_counter() - start > time_budget_s:
            break
        done += 1
        drawn = geo.lengths(lengths, seed + k)
        trace = plan(run, drawn)
        for risk in trace_risks(trace, drawn, budgets, width):
            hits.setdefault((risk.kind, risk.stage), []).append(risk)
    out = []
    for found in hits.values():
        risk = found[0]
        risk.probability = len(found) / done if risk.kind != "c" else None
        risk.draws = done if risk.kind != "c" else None
        out.append(risk)
    return out
