"""The answers to failures that are not an allocation: an NCCL watchdog timeout read rank by rank (which collective,
who is behind, what verl issues that op for), Ray's host-memory kill, and a worker that died without a word."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from labkit.diagnose.log_failures import HostOom, LabRank, NcclTimeout

OPS = {
    "ALLREDUCE": "an all-reduce",
    "_ALLGATHER_BASE": "FSDP's parameter all-gather before a unit's forward or backward",
    "ALLGATHER": "an all-gather (FSDP's parameters, or log-probs / outputs gathered over a group)",
    "ALLGATHER_INTO_TENSOR_COALESCED": "FSDP2's parameter all-gather before a unit's forward or backward",
    "_REDUCE_SCATTER_BASE": "FSDP's gradient reduce-scatter after a unit's backward",
    "REDUCE_SCATTER": "FSDP's gradient reduce-scatter after a unit's backward",
    "REDUCE_SCATTER_TENSOR_COALESCED": "FSDP2's gradient reduce-scatter after a unit's backward",
    "ALLTOALL": "Ulysses sequence parallelism's all-to-all around attention",
    "ALLTOALL_BASE": "Ulysses sequence parallelism's all-to-all around attention",
    "BROADCAST": "a broadcast (the batch to a TP / SP group, or weights to the rollout engine)",
    "SEND": "a point-to-point send",
    "RECV": "a point-to-point receive",
}


def op_meaning(t: NcclTimeout) -> str:
    """What verl issues this collective for, from its op and element count."""
    if t.op == "ALLREDUCE" and t.numel_in == 1:
        return (
            "a one-element all-reduce: dynamic batch size's micro-batch count, taken as the max over the DP group "
            "(rearrange_micro_batches), or a scalar metric"
        )
    return OPS.get(t.op, f"a {t.op} collective")


def hang_lines(timeouts: list[NcclTimeout], world: int | None) -> list[str]:
    """Rank by rank: the collective each waits in; whether they agree; the ranks that said nothing."""
    lines = []
    for t in timeouts:
        group = f" of process group [{t.group}]" if t.group else ""
        last = (
            f" (last enqueued #{t.last_enqueued}, last completed #{t.last_completed})"
            if t.last_completed is not None
            else ""
        )
        lines.append(
            f"rank {t.rank}: waited {t.timeout_ms / 1000:,.0f} s in {t.op} #{t.seq}{group}, {t.numel_in:,} elements"
            f"{last}: {op_meaning(t)}"
        )
    by_seq: dict[tuple[str, int], list[int]] = defaultdict(list)
    for t in timeouts:
        by_seq[(t.group, t.seq)].append(t.rank)
    groups = {g for g, _ in by_seq}
    for g in sorted(groups):
        seqs = sorted((seq, ranks) for (gg, seq), ranks in by_seq.items() if gg == g)
        if len(seqs) > 1:
            low, high = seqs[0], seqs[-1]
            lines.append(
                f"the ranks disagree on the count: rank(s) {_ranks(low[1])} wait in #{low[0]} while rank(s) "
                f"{_ranks(high[1])} are already at #{high[0]}: the lower ones issued {high[0] - low[0]} fewer "
                "collectives of this group, so they ran fewer micro-batches or skipped a collective the others made "
                "(a count mismatch: labkit's hang kinds (a) and (b), docs/hangs.md)"
            )
        elif seqs and seqs[0][0] == 1:
            lines.append(
                "the group's first collective never completed: the ranks never all met (NCCL start-up, the network, "
                "a rank that died or is still loading), not a micro-batch count mismatch"
            )
        elif seqs:
            lines.append(
                f"every rank that reported waits in the same collective #{seqs[0][0]}: a rank that did not report "
                "is elsewhere (it died, raised, or runs a different count); find its own error first"
            )
    if world:
        silent = sorted(set(range(world)) - {t.rank for t in timeouts})
        if silent:
            lines.append(f"no watchdog report from rank(s) {_ranks(silent)} of the {world} in the config")
    return lines


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def host_lines(h: HostOom, offload: dict[str, Any] | None) -> list[str]:
    """Ray's kill: the process, its memory, the node's; the largest users; what holds host memory in verl."""
    lines = []
    if h.process:
        lines.append(
            f"Ray killed {h.process} ({h.process_gb:,.2f} GB) when the node used {h.node_used_gb:,.2f} of "
            f"{h.node_total_gb:,.2f} GB (threshold {h.threshold})"
        )
    else:
        lines.append("Ray killed a process because the node ran low on host memory (its figures are not in the log)")
    if h.top:
        by_cmd: dict[str, list[float]] = defaultdict(list)
        for gb, cmd in h.top:
            by_cmd[cmd.split()[0][:60]].append(gb)
        lines.append(
            "largest users: "
            + "; ".join(
                f"{len(v)} × {k} ({sum(v):,.1f} GB)" for k, v in sorted(by_cmd.items(), key=lambda kv: -sum(kv[1]))
            )
        )
    if offload:
        lines.append(
            f"with this config each training process keeps {offload['gib']:,.1f} GiB of {offload['what']} on the "
            f"host ({offload['processes']} processes on a node: {offload['gib'] * offload['processes']:,.1f} GiB)"
        )
    lines.append(
        "host memory in a verl run: FSDP's CPU offload (param_offload 4·P/F, optimizer_offload 8·P/F bytes per "
        "process), the rollout batch in Ray's object store and the driver (it grows with train_batch_size × n × "
        "response_length), vLLM's swap space and sleeping weights, dataloader workers. Lower those, or give Ray "
        "more (RAY_memory_usage_threshold only moves the line)."
    )
    return lines


def died_lines() -> list[str]:
    """A worker Ray saw die with no exception of its own."""
    return [
        "a Ray worker died without an exception of its own (exit SYSTEM_ERROR, connection closed): most often the "
        "kernel's OOM killer (host memory), else a crash (SIGSEGV) or ray stop. On the node, `dmesg -T | grep -i "
        "-E 'killed process|out of memory'` says which; labkit cannot tell from this log."
    ]


def lab_lines(ranks: list[LabRank]) -> tuple[list[str], bool]:
    """labkit's own hang report read back: who waited in which call, what the others issued of that collective,
    and whether the counts differ (the mismatch that hung it)."""
    lines, mismatch = [], False
    for r in ranks:
        if r.outcome == "waited":
            lines.append(f"rank {r.rank}: waited in {r.collective} call #{r.call} at {r.stage}")
            for other in ranks:
                if other.rank != r.rank and other.issued.get(r.collective, 0) < (r.call or 0):
                    mismatch = True
                    lines.append(
                        f"  rank {other.rank} {other.outcome} at {other.stage} having issued {r.collective} "
                        f"{other.issued.get(r.collective, 0)} time(s): {(r.call or 0) - other.issued.get(r.collective, 0)} "
                        "fewer, so the call never completes (a collective count mismatch)"
                    )
    return lines, mismatch
