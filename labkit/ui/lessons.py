"""Small computations the micro-batch and balance notebooks (03, 04) need, kept out of notebook cells.

Everything here composes labkit's mirrors of verl (``labkit.balance.micro_batches``, ``labkit.balance.balance_batch``): per-bucket token sums,
the rows each DP rank holds after ``RayPPOTrainer._balance_batch``, micro-batch counts per rank with and without the
DP MAX all-reduce of ``verl/utils/seqlen_balancing.py: rearrange_micro_batches``, and what each rank does when one
rank's check fails while its peers go on (the collective mismatch behind verl's NCCL hangs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from labkit.balance.balance_batch import balance_batch, calculate_workload
from labkit.balance.lockstep import free_partitions
from labkit.balance.micro_batches import plan_dp_micro_batches, rank_plan_steps
from labkit.config.keys import ARR
from labkit.rules.catalogue import message
from labkit.rules.geometry import ceil_div


def overrides(
    *,
    ranks: int,
    n_prompts: int,
    n: int,
    prompt_length: int,
    response_length: int,
    dynamic: bool,
    budget: int,
    micro: int,
    sp: int = 1,
    balance: bool = True,
    tp: int = 1,
) -> list[str]:
    """Hydra-style overrides for a GRPO step whose forward and update stages all use one micro-batching setting.

    ``budget`` is the per-GPU token budget (``ppo_max_token_len_per_gpu``; the log-prob budgets follow it) and
    ``micro`` the static rows per GPU (``ppo_micro_batch_size_per_gpu`` and both ``log_prob_micro_batch_size_per_gpu``).
    """
    return [
        f"trainer.n_gpus_per_node={ranks}",
        f"data.train_batch_size={n_prompts}",
        f"{ARR}.rollout.n={n}",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={response_length}",
        f"{ARR}.actor.ppo_mini_batch_size={n_prompts}",
        f"{ARR}.actor.ulysses_sequence_parallel_size={sp}",
        f"{ARR}.ref.ulysses_sequence_parallel_size={sp}",
        f"{ARR}.actor.use_dynamic_bsz={str(dynamic).lower()}",
        f"{ARR}.actor.ppo_max_token_len_per_gpu={budget}",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"{ARR}.ref.log_prob_micro_batch_size_per_gpu={micro}",
        f"{ARR}.rollout.tensor_model_parallel_size={tp}",
        f"trainer.balance_batch={str(balance).lower()}",
        "algorithm.adv_estimator=grpo",
    ]


def bucket_tokens(lengths: Sequence[int], buckets: Sequence[Sequence[int]]) -> list[int]:
    """Real tokens of each bucket (micro-batch or DP partition) given as row-index lists."""
    return [sum(int(lengths[i]) for i in bucket) for bucket in buckets]


def in_micro_order(values: Sequence[Any], buckets: Sequence[Sequence[int]]) -> list[Any]:
    """Per-row values concatenated in micro-batch order: what the forward passes of dynamic buckets return."""
    return [values[i] for bucket in buckets for i in bucket]


def max_min(values: Sequence[float], digits: int = 2) -> float:
    """max/min of a list (the spread ratio of a balance picture), rounded to ``digits`` decimals (2 by default)."""
    return round(max(values) / min(values), digits)


def dp_lengths(lengths: Sequence[int], dp_size: int, balance: bool = True) -> list[list[int]]:
    """Lengths each DP rank holds: ``_balance_batch`` partitions (rows in its small-large-small order) or, without
    balancing, the equal consecutive chunks the DP dispatch cuts from the generation order."""
    if balance:
        return [[int(lengths[i]) for i in part] for part in balance_batch(lengths, dp_size).partitions]
    size = len(lengths) // dp_size
    return [list(map(int, lengths[r * size : (r + 1) * size])) for r in range(dp_size)]


def micro_counts(
    per_rank: Sequence[Sequence[int]], budget: int, profile: str = "legacy", sync: bool = True
) -> list[int]:
    """Dynamic micro-batches per DP rank with the MAX all-reduce (``sync``) or with each rank on its own.

    Legacy verl only counts: k = min(rows, ceil(tokens / budget)), then the MAX (its KK never changes k), so the
    count needs no partitioning; the engine adds micro-batches until every one fits, which only KK can tell."""
    if profile == "legacy":
        for rank in per_rank:  # the checks verl runs before it counts (E31), as plan_dp_micro_batches raises them
            assert budget >= max(rank), message("E31", budget=budget, longest=repr(max(rank)))
        counts = [min(len(rank), ceil_div(sum(rank), budget)) for rank in per_rank]
        if sync:
            counts = [max(counts)] * len(counts)
            assert all(k <= len(rank) for k, rank in zip(counts, per_rank))  # E32, a bare assert in verl
        return counts
    plans = plan_dp_micro_batches(per_rank, budget, profile=profile, dp_group=sync)
    return [p.num_micro_batches for p in plans]


def over_budget(per_rank_tokens: Sequence[Sequence[int]], budget: int) -> list[tuple[int, int, int]]:
    """(dp_rank, micro-batch, tokens) of every micro-batch holding more tokens than the budget."""
    return [(r, i, t) for r, toks in enumerate(per_rank_tokens) for i, t in enumerate(toks) if t > budget]


def trace_micro_tokens(trace: Any, stage: str) -> list[list[int]]:
    """Tokens of each micro-batch, per DP rank (SP rank 0 of each DP group), from a ``StepTrace``."""
    return [[m.tokens for m in r.micro_batches] for r in dp_records(trace, stage)]


def dp_records(trace: Any, stage: str) -> list[Any]:
    """One RankRecord per DP rank (its SP rank 0) of a ``StepTrace`` stage."""
    return [r for r in trace.at(stage) if not r.sp_rank]


def rank_lengths(trace: Any, lengths: Sequence[int]) -> list[list[int]]:
    """Lengths each DP rank received, in the order it received them, from the planner's ``balance`` stage."""
    return [[int(lengths[i]) for i in r.extra["indices"]] for r in dp_records(trace, "balance")]


@dataclass
class RankOutcome:
    """What one DP rank's ``rearrange_micro_batches`` does: returns ``micro_batches`` or raises ``error``."""

    dp_rank: int
    micro_batches: int | None = None
    error: str | None = None
    hangs: bool = False  # it returned, but a peer raised: its next collective never completes

    def __str__(self) -> str:
        if self.error is not None:
            return f"dp_rank {self.dp_rank}: raises {self.error}"
        tail = "; then waits forever in its next collective (a peer crashed)" if self.hangs else ""
        return f"dp_rank {self.dp_rank}: {self.micro_batches} micro-batches{tail}"


def rank_outcomes(per_rank: Sequence[Sequence[int]], budget: int, profile: str = "legacy") -> list[RankOutcome]:
    """Run every DP rank's dynamic micro-batching in lockstep through the DP all-reduces and record, per rank,
    whether it returns or raises (unlike ``plan_dp_micro_batches``, which stops at the first error)."""
    steps = [rank_plan_steps(lens, budget, profile, None, True, None, None, True, 1) for lens in per_rank]
    out = [RankOutcome(r) for r in range(len(per_rank))]
    replies: dict[int, Any] = {r: None for r in range(len(per_rank))}
    while replies:
        requests = {}
        for r, reply in replies.items():
            try:
                requests[r] = _next_all_reduce(steps[r], reply)
            except StopIteration as done:
                out[r].micro_batches = done.value.num_micro_batches
            except (AssertionError, ValueError) as err:
                out[r].error = f"{type(err).__name__}: {err}" if str(err) else f"{type(err).__name__} (bare assert)"
        if len(requests) < len(replies) and requests:  # a peer left the lockstep: the all-reduce never completes
            for r in requests:
                out[r].hangs = True
            break
        reduce = max if requests and next(iter(requests.values()))[0] == "max" else min
        reduced = [reduce(col) for col in zip(*(v for _, v in requests.values()))]
        replies = {r: list(reduced) for r in requests}
    if any(o.error for o in out):
        for o in out:
            o.hangs = o.hangs or o.error is None
    return out


def _next_all_reduce(steps: Any, reply: Any) -> tuple[str, list[int]]:
    """Send a rank its reply and answer its local KK requests until it asks for a DP all-reduce."""
    op, values = steps.send(reply)
    while op == "kk":
        op, values = steps.send(free_partitions(*values))
    return op, values


def is_small_large_small(values: Sequence[float]) -> bool:
    """True when values rise to one peak and then fall (``_balance_batch``'s in-rank order)."""
    peak = max(range(len(values)), key=lambda i: (values[i], -i))
    up, down = values[: peak + 1], values[peak:]
    return all(a <= b for a, b in zip(up, up[1:])) and all(a >= b for a, b in zip(down, down[1:]))


def workloads(lengths: Sequence[int]) -> list[int]:
    """verl's per-row workload 24576·L + L² (``calculate_workload``), as a list."""
    return calculate_workload([int(x) for x in lengths])
