"""Predicted collectives that depend on what a live run produced, added to a plan so ``labkit.trace.compare`` can
check them: the rollout TP all-reduces, logit broadcasts and fingerprints of generate, from each replica's longest
response (HF ``generate`` runs one forward step per token of its longest row). Mirrors the counts of
``labkit.model.tp_communications`` (Megatron's f/g pair, which vLLM uses for verl's rollout TP).
"""

from __future__ import annotations

from typing import Any

from labkit.rules.collectives import tp_generate_collectives
from labkit.trace import StepTrace


def replica_forward_steps(out: Any, replicas: int) -> list[int]:
    """Forward steps of each rollout replica: the longest response (tokens up to and with EOS) of its rows, the
    collected output being the replicas' rows in order."""
    lengths = out.batch["response_mask"].sum(-1).tolist()
    size = len(lengths) // replicas
    return [int(max(lengths[r * size : (r + 1) * size])) for r in range(replicas)]


def add_tp_prediction(pred: StepTrace, out: Any, num_layers: int, tp: int, sync_logits: bool = True) -> StepTrace:
    """Add each rank's TP collectives of generate to the planned ``pred`` (in place; returned for chaining)."""
    recs = pred.at("generate")
    replicas = max(r.dp_rank for r in recs) + 1
    steps = replica_forward_steps(out, replicas)
    for r in recs:
        for name, count in tp_generate_collectives(num_layers, steps[r.dp_rank], tp, sync_logits).items():
            r.collectives[name] = r.collectives.get(name, 0) + count
    return pred
