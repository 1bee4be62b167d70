"""The engine path's metric collectives on a rank, counted under the planner's names: per forward-only call and per
update mini-batch the summed loss is AVG-reduced and the metrics are gathered over the DP group, and per mini-batch
every row's token count is gathered for MFU. Mirrors verl/workers/engine_workers.py: TrainingWorker._postprocess_output
and train_mini_batch (0.9.1). The legacy dp_actor reduces metrics on the driver and issues none of these.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.rl.actor_record import CallRecord
from labkit.runtime import dist


def postprocess(w: Any, rec: CallRecord, loss: float, metrics: dict[str, Any]) -> float:
    """The DP average of ``loss`` (one all-reduce) and every rank's metrics (one object all-gather); the gathered
    metrics must hold as many values per key on every rank (verl's Metric DP aggregation), else every rank raises
    verl's ValueError together. Returns the averaged loss."""
    t = torch.tensor([float(loss)], dtype=torch.float64, device=w.device)
    avg = float(dist.all_reduce(t, "avg", group=w.dp_group, name="all_reduce(avg):loss").item())
    rec.count("all_reduce(avg):loss")
    gathered = dist.all_gather_object(metrics, group=w.dp_group, name="all_gather_object(metrics)")
    rec.count("all_gather_object(metrics)")
    for key in metrics:
        lens = [len(g[key]) if isinstance(g.get(key), list) else None for g in gathered]
        if len(set(lens)) != 1:
            raise ValueError(
                f"All Metric instances must have the same number of values for dp aggregation: {lens} ({key})"
            )
    return avg


def global_token_num(w: Any, rec: CallRecord, lengths: list[int]) -> list[int]:
    """Every DP rank's row lengths of this mini-batch, in DP-rank order (what verl feeds its MFU estimate)."""
    parts = dist.all_gather_object(
        [int(x) for x in lengths], group=w.dp_group, name="all_gather_object(global_token_num)"
    )
    rec.count("all_gather_object(global_token_num)")
    return [x for part in parts for x in part]
