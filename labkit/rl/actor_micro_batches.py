"""How the actor cuts one DP rank's rows into micro-batches: the temperature verl reads, padded or packed rows, the
engine's global token count (one all-reduce that also carries every rank's E31 verdict) and the token-budget
micro-batches whose count is MAX-synced over the DP group. Shared by the log-prob pass (``labkit.rl.actor``) and the
update (``labkit.rl.actor_update``). Mirrors verl/utils/seqlen_balancing.py: rearrange_micro_batches as
verl/workers/actor/dp_actor.py (legacy) and verl/workers/engine/utils.py: prepare_micro_batches (engine) call it.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.balance.micro_batches import rearrange_micro_batches
from labkit.protocol.data_proto import DataProto
from labkit.rl import actor_math as am
from labkit.rl.actor_record import CallRecord
from labkit.rules.catalogue import message
from labkit.rules.collectives import micro_batch_sync_name
from labkit.rules.dp_sync import dp_group_passed, sync_group
from labkit.runtime import dist


class ActorMicroBatches:
    """The micro-batch helpers of ``labkit.rl.actor.ActorWorker`` over its settings and DP group."""

    s: am.ActorSettings
    dp_rank: int
    dp_size: int
    dp_group: Any
    device: torch.device

    def _temperature(self, data: DataProto) -> float:
        if "temperature" not in data.meta_info:
            raise KeyError("temperature must be in data.meta_info (verl reads it there to avoid a silent default)")
        return float(data.meta_info["temperature"])

    def _rmpad(self) -> bool:
        return self.s.use_remove_padding

    def _pad_to_longest(self) -> bool:
        """Engine without rmpad pads each micro-batch to its longest row; legacy dp_actor feeds the full width."""
        return self.s.profile == "engine" and not self.s.use_remove_padding

    def _batch_num_tokens(self, rec: CallRecord, data: DataProto, budget: int | None) -> int:
        """Engine: response tokens summed over the DP group (the global loss denominator). The same all-reduce also
        carries each DP rank's E31 verdict, so every rank raises verl's E31 together instead of peers hanging."""
        if "response_mask" in data.batch.keys():
            tokens = int(data.batch["response_mask"].sum())
        else:
            tokens = int(data.batch["attention_mask"][:, -data.batch["responses"].shape[1] :].sum())
        payload = torch.zeros(1 + self.dp_size, dtype=torch.long)
        payload[0] = tokens
        longest = int(data.batch["attention_mask"].sum(-1).max()) if len(data) else 0
        if budget is not None and longest > budget:
            payload[1 + self.dp_rank] = longest
        payload = dist.all_reduce(payload.to(self.device), "sum", group=self.dp_group).cpu()
        rec.count("all_reduce(sum):batch_num_tokens")
        bad = [int(v) for v in payload[1:] if v > 0]
        if bad:
            own = longest if longest > budget else bad[0]
            raise AssertionError(message("E31", budget=budget, longest=f"tensor({own})"))
        return int(payload[0])

    def _dynamic_parts(self, rec: CallRecord, data: DataProto, budget: int) -> list[list[int]]:
        """Token-budget micro-batches; the count is MAX-synced over the group ``labkit.rules.dp_sync`` names: the
        world (legacy, 0.8: dp_group None) or the DP group (engine). Mirrors seqlen_balancing.rearrange_micro_batches."""
        lens = data.batch["attention_mask"].sum(-1)
        legacy = self.s.profile == "legacy"
        skip = self.s.extra.get("skip_dp_sync", False)  # verl 0.7.1 dp_actor: no dp_group, the MAX sync is skipped
        which = None if skip else sync_group(self.s.profile, dp_group_passed(self.s.profile))
        group = self.dp_group if which == "dp" else None  # "world": the default group
        seen = {"max": 0}

        def sync(op: str, values: list[int]) -> list[int]:
            name = micro_batch_sync_name(op, seen["max"])
            seen["max"] += op == "max"
            t = torch.tensor(values, dtype=torch.long, device=self.device)
            dist.all_reduce(t, op, group=group, name=name)
            rec.count(name)
            return t.tolist()

        plan = rearrange_micro_batches(
            lens,
            budget,
            profile=self.s.profile,
            dp_sync=None if which is None else sync,
            max_seq_len=data.batch["attention_mask"].shape[-1] if legacy else None,
        )
        return plan.indices
