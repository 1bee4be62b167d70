"""Claims of the second post about its parameter table, the edge cases of dynamic micro-batching, its 8-sample
example and its recommended configuration (claims p2-40 to p2-49).
"""

from __future__ import annotations

from labkit.balance.balance_batch import calculate_workload
from labkit.balance.micro_batches import plan_dp_micro_batches, rearrange_micro_batches, static_micro_batches
from labkit.rules.catalogue import message
from labkit.ui.lessons import bucket_tokens, max_min
from labkit.ui.seed_claims.probe import (
    BUDGET8,
    DYN,
    DYNAMIC,
    GSM,
    LEGACY,
    PROFILE,
    SEED8,
    V0,
    V1,
    A,
    R,
    first_error,
    per_rank,
    trace,
)
from labkit.ui.seed_claims.record import Case, Checked, Unknown, claim

GROUP = "parameters, edge cases, the 8-sample example and advice (post 2)"
BOTH = (LEGACY, V1)
RMPAD = "actor_rollout_ref.model.use_remove_padding"


@claim("p2-40", GROUP, "E21", "0.6–0.8, 0.9.1 v1")
def parameter_table() -> Checked:
    """The *_micro_batch_size_per_gpu keys are ignored when use_dynamic_bsz is on; the token budgets are ignored
    when it is off."""
    cases = []
    for v in BOTH:

        def tokens(*over):
            return [m.tokens for m in trace(v, *over, lengths=GSM).at("update_actor")[0].micro_batches]

        cases.append(
            Case(
                "dynamic: update micro-batches with ppo_micro_batch_size_per_gpu 8 and 4 equal",
                True,
                tokens(*DYN) == tokens(*DYN, f"{A}.ppo_micro_batch_size_per_gpu=4"),
                v,
            )
        )
        cases.append(
            Case(
                "static: update micro-batches with ppo_max_token_len_per_gpu 4096 and 2048 equal",
                True,
                tokens(f"{A}.ppo_max_token_len_per_gpu=4096") == tokens(f"{A}.ppo_max_token_len_per_gpu=2048"),
                v,
            )
        )
    err = first_error(LEGACY, *DYN, f"{A}.ppo_micro_batch_size_per_gpu=7")
    return cases, [f"[{LEGACY}] dynamic with ppo_micro_batch_size_per_gpu=7: {err[0]} at {err[1]}: {err[2]}"]


@claim("p2-41", GROUP, "E31", "0.6–0.8, 0.9.1 v1")
def lengths_unrelated() -> Checked:
    """data.max_prompt_length and data.max_response_length have nothing to do with dynamic batch size."""
    cases = []
    budget = (f"{A}.ppo_max_token_len_per_gpu=2048", f"{R}.log_prob_max_token_len_per_gpu=2048", *DYNAMIC)
    for v in BOTH:
        outcomes = []
        for resp in (512, 2048):
            tr = trace(v, *budget, f"data.max_response_length={resp}", lengths=GSM)
            outcomes.append(sorted({e["code"] for e in tr.summary["stage_errors"].values()}) or "runs")
        cases.append(
            Case(
                "budget 2048, rows < 1200 tokens: outcome with max_response_length 512 and 2048",
                "same",
                "same" if outcomes[0] == outcomes[1] else f"{outcomes[0]} vs {outcomes[1]}",
                v,
            )
        )
    err = trace(LEGACY, *budget, "data.max_response_length=2048", lengths=GSM).summary["stage_errors"]
    return cases, [f"[{LEGACY}] " + next(iter(err.values()))["message"]] if err else []


@claim("p2-42", GROUP, "N3", "0.6–0.8, 0.9.1 v0")
def critic_budget_only_dynamic() -> Checked:
    """critic.ppo_max_token_len_per_gpu only matters when the critic uses dynamic batch size."""
    ppo = ("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8")
    cases = []
    for v in (LEGACY, V0):
        for dyn in ("false", "true"):
            counts = [
                per_rank(
                    trace(
                        v, *ppo, f"critic.use_dynamic_bsz={dyn}", f"critic.ppo_max_token_len_per_gpu={b}", lengths=GSM
                    ),
                    "update_critic",
                    "n_micro",
                )[0]
                for b in (4096, 8192)
            ]
            cases.append(
                Case(
                    f"critic.use_dynamic_bsz={dyn}: update_critic micro-batches change with the budget",
                    dyn == "true",
                    counts[0] != counts[1],
                    v,
                )
            )
    return cases


@claim("p2-43", GROUP, "E35", "0.6–0.8, 0.9.1 v1")
def bucket_assert() -> Checked:
    """A hard `assert num_micro_batches <= num_groups` guarantees at least one real sample in every bucket."""
    cases = []
    for v in BOTH:
        try:
            plan_dp_micro_batches([SEED8, [4000, 4000]], BUDGET8, profile=PROFILE[v])
            seen = "no error"
        except (AssertionError, ValueError) as exc:
            seen = f"{type(exc).__name__}{': ' + str(exc) if str(exc) else ' (bare assert)'}"
        cases.append(
            Case(
                "3 synced micro-batches on a rank with 2 rows",
                "AssertionError (bare assert)",
                seen,
                v,
                match=lambda c, o: o.startswith("AssertionError"),
            )
        )
        ok = plan_dp_micro_batches([SEED8, [800] * 8], BUDGET8, profile=PROFILE[v])
        cases.append(Case("every bucket holds a real row (normal case)", True, all(all(p.indices) for p in ok), v))
    return cases, [
        "verl's equal dispatch gives every DP rank the same row count, so a rank meets this only "
        "with unequal dispatch (a fork)"
    ]


@claim("p2-44", GROUP, "F7", "0.6–0.8, 0.9.1 v1")
def long_sample_slow_bucket() -> Checked:
    """A single very long sample can still make one micro-batch much slower and trip the NCCL watchdog: one root
    cause of verl issue #5750."""
    rank = [9000] + [300] * 15
    cases = []
    for v in BOTH:
        w = rearrange_micro_batches(rank, BUDGET8, profile=PROFILE[v]).workloads
        cases.append(
            Case(
                "heaviest / lightest bucket workload > 2 (one 9000-token row, 15 of 300)", True, max(w) / min(w) > 2, v
            )
        )
    cases.append(Case("it is a root cause of issue #5750", True, Unknown("an issue's cause is not in verl's code")))
    return cases


@claim("p2-45", GROUP, "F7", "0.6–0.8, 0.9.1 v1")
def int64_upcast() -> Checked:
    """verl PR #5110 casts the sequence lengths to int64 before the workloads are computed."""
    import torch

    rows = torch.tensor([50000, 100, 100], dtype=torch.int32)
    exact = sum(24576 * x + x * x for x in (50000, 100, 100))
    cases = [
        Case(
            "workload of int32 lengths [50000, 100, 100], computed exactly (64-bit)",
            exact,
            rearrange_micro_batches(rows, 60000, profile=PROFILE[v]).workloads[0],
            v,
        )
        for v in BOTH
    ]
    wrapped = int(calculate_workload(torch.tensor([50000], dtype=torch.int32))[0])
    return cases, [f"in int32 the workload of a 50000-token row wraps to {wrapped} (exact {24576 * 50000 + 50000**2})"]


@claim("p2-46", GROUP, "S3", "0.6–0.8, 0.9.1 v1")
def seed8_static() -> Checked:
    """The 8-sample example split statically by 2 rows: buckets of 7300, 5200, 11500 and 9000 tokens, max/min
    2.21×."""
    cases = []
    for v in BOTH:
        toks = bucket_tokens(SEED8, static_micro_batches(8, 2, profile=PROFILE[v]))
        cases.append(
            Case("tokens per micro-batch, max/min", ([7300, 5200, 11500, 9000], 2.21), (toks, max_min(toks)), v)
        )
    return cases


@claim("p2-47", GROUP, "F7", "0.6–0.8, 0.9.1 v1")
def seed8_dynamic() -> Checked:
    """The 8-sample example with a 13,312-token budget: 3 buckets of 11,300, 11,200 and 10,500 tokens, max/min
    1.08×."""
    cases = []
    for v in BOTH:
        toks = rearrange_micro_batches(SEED8, BUDGET8, profile=PROFILE[v]).tokens
        cases.append(
            Case(
                "buckets, their tokens (any order), max/min",
                (3, [10500, 11200, 11300], 1.08),
                (len(toks), sorted(toks), max_min(toks)),
                v,
            )
        )
        cases.append(Case("tokens in execution order", [11300, 11200, 10500], toks, v, caveat=True))
    return cases, [message("F7", tokens=sum(SEED8), budget=BUDGET8, k=3, synced=3)]


@claim("p2-48", GROUP, "F7", "0.6–0.8, 0.9.1 v1")
def budget_is_cap() -> Checked:
    """The static split's 11,500-token bucket is close to the 13,312 budget and a lower budget would run out of
    memory, while the dynamic buckets all stay under the budget: no OOM risk."""
    cases = []
    for v in BOTH:
        for rows, budget in ((SEED8, BUDGET8), ([6000, 6000, 6000, 1000], 10000)):
            toks = rearrange_micro_batches(rows, budget, profile=PROFILE[v]).tokens
            cases.append(
                Case(f"{rows}, budget {budget}: largest dynamic bucket ≤ budget", True, max(toks) <= budget, v)
            )
    notes = [
        f"[{v}] [6000, 6000, 6000, 1000], budget 10000: buckets "
        f"{rearrange_micro_batches([6000, 6000, 6000, 1000], 10000, profile=PROFILE[v]).tokens}"
        for v in BOTH
    ]
    return cases, notes


@claim("p2-49", GROUP, "F10", "0.6–0.8, 0.9.1 v1")
def recommended_config() -> Checked:
    """Recommended: use_dynamic_bsz=True with use_remove_padding=True, the most efficient choice for sequences of
    varying length."""
    notes = []
    for v in BOTH:
        for dyn in (False, True):
            for rm in ("false", "true"):
                rec = trace(v, *(DYN if dyn else ()), f"{RMPAD}={rm}", lengths=GSM).at("update_actor")[0]
                notes.append(
                    f"[{v}] dynamic={dyn}, rmpad={rm}: {rec.n_micro} micro-batches, "
                    f"{sum(m.padded_tokens for m in rec.micro_batches)} tokens through the forward on GPU 0"
                )
    cases = [
        Case(
            "the most efficient configuration",
            "dynamic + rmpad",
            Unknown("efficiency is time on a GPU; labkit counts tokens and micro-batches (see the notes)"),
        )
    ]
    return cases, notes
