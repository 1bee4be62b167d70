"""The driver side of verl 0.9.1's v1 step (``trainer.use_v1=true``, sync mode) on labkit's live ranks: the B
prompts split over the agent-loop workers, n sessions per prompt inside its worker, rows in completion order,
synthetic padding rows up to the required multiple, and the always-on ``_balance_batch`` (KK, ascending index).
Mirrors verl/trainer/ppo/v1/trainer_base.py: PPOTrainer._step_once, agent_loop_tq.py and padding_utils.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from labkit.balance.balance_batch import log_seqlen_unbalance, v1_partitions
from labkit.protocol.data_proto import DataProto
from labkit.rules.v1_loop import PADDING_PROMPT_LEN, SYNTHETIC_PADDING_SEQ_LEN, agent_loop_split

PADDING_UID = "pad00000000000000000000000000000000"
"""The one uid all synthetic rows share (verl draws ``pad<hex>``): they form a GRPO group of their own."""


@dataclass
class V1Batch:
    """What the v1 driver did to the rollout's rows: split, completion order, padding, balance partitions."""

    prompts_per_worker: list[int]
    """Prompts each agent-loop worker received (``TensorDict.chunk(A)`` of the B prompts, uneven allowed)."""
    completion_order: list[int]
    """Trajectory indices p·n + session in the order they finished (the replay buffer's row order)."""
    end_steps: list[int]
    """Per trajectory (submission order): the decoding step at which it ended (its generated tokens)."""
    padding_rows: int
    partitions: list[list[int]] = field(default_factory=list)
    """Rows of the padded batch per DP rank, each in ascending batch index (KK, equal size)."""
    metrics: dict = field(default_factory=dict)


def sessions(prompts: DataProto, n: int, workers: int) -> tuple[DataProto, list[int]]:
    """The generation rows: agent-loop worker w takes its chunk of prompts and starts n sessions for each (no
    driver-wide repeat); rows are worker-major, then prompt, then session, i.e. trajectory index p·n + session.
    Mirrors AgentLoopManagerTQ.generate_sequences + AgentLoopWorkerTQ._run_prompt."""
    split = agent_loop_split(len(prompts), workers)
    starts = np.cumsum([0, *split])
    rows, worker, session = [], [], []
    for w, k in enumerate(split):
        for p in range(starts[w], starts[w] + k):
            rows += [int(p)] * n
            worker += [w] * n
            session += list(range(n))
    out = prompts.select_idxs(rows)
    out.meta_info = dict(prompts.meta_info)
    out.non_tensor_batch["agent_worker"] = np.array(worker, dtype=np.int64)
    out.non_tensor_batch["session_id"] = np.array(session, dtype=np.int64)
    return out, split


def completion_order(end_steps: Sequence[int], agent_worker: Sequence[int]) -> list[int]:
    """The order the trajectories finish in the live rollout: by the decoding step at which each sequence ended (its
    generated tokens, EOS included; all replicas decode in lockstep steps), ties by agent-loop worker, then by
    submission. This is the order in which v1 registers them in TransferQueue and the replay buffer returns them."""
    return sorted(range(len(end_steps)), key=lambda i: (int(end_steps[i]), int(agent_worker[i]), i))


def _left_widen(t: torch.Tensor, to: int, value: int) -> torch.Tensor:
    extra = to - t.shape[1]
    return t if extra <= 0 else torch.cat([t.new_full((t.shape[0], extra), value), t], dim=1)


def add_padding_rows(batch: DataProto, count: int, eos_token_id: int, pad_token_id: int) -> DataProto:
    """``batch`` + ``count`` synthetic rows: 127 EOS prompt tokens + 1 EOS response token (128 positions), attention
    mask 1 on those 128, response mask 0, one shared uid. Real rows' prompts are left-widened to 127 columns when
    needed (pad tokens, mask 0), so a padding row fits. Mirrors padding_utils.upsample_batch_to_divisible_size."""
    if count <= 0:
        return batch
    b = batch.batch
    P, R = b["prompts"].shape[1], b["responses"].shape[1]
    width = max(P, PADDING_PROMPT_LEN)
    prompts = _left_widen(b["prompts"], width, pad_token_id)
    prompt_mask = _left_widen(b["attention_mask"][:, :P], width, 0)
    prompt_pos = _left_widen(b["position_ids"][:, :P], width, 0)
    real = {
        **{k: v for k, v in b.items() if k not in ("prompts", "input_ids", "attention_mask", "position_ids")},
        "prompts": prompts,
        "input_ids": torch.cat([prompts, b["responses"]], dim=1),
        "attention_mask": torch.cat([prompt_mask, b["attention_mask"][:, P:]], dim=1),
        "position_ids": torch.cat([prompt_pos, b["position_ids"][:, P:]], dim=1),
    }
    pad_prompt = torch.full((count, width), pad_token_id, dtype=prompts.dtype)
    pad_prompt[:, width - PADDING_PROMPT_LEN :] = eos_token_id
    pad_resp = torch.full((count, R), pad_token_id, dtype=prompts.dtype)
    pad_resp[:, 0] = eos_token_id
    mask = torch.zeros((count, width + R), dtype=real["attention_mask"].dtype)
    mask[:, width - PADDING_PROMPT_LEN : width + 1] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    pos[:, width:] = pos[:, width - 1 : width] + torch.arange(1, R + 1)
    synthetic = {
        "prompts": pad_prompt,
        "responses": pad_resp,
        "input_ids": torch.cat([pad_prompt, pad_resp], dim=1),
        "attention_mask": mask,
        "position_ids": pos.to(real["position_ids"].dtype),
    }
    for k, v in real.items():  # every other field (response_mask, response_length, …) zero, as verl's template
        synthetic.setdefault(k, torch.zeros((count, *v.shape[1:]), dtype=v.dtype))
    assert int(mask.sum(1).max()) == SYNTHETIC_PADDING_SEQ_LEN
    nt = batch.non_tensor_batch
    extra = {
        "uid": np.array([PADDING_UID] * count, dtype=object),
        "agent_worker": np.full(count, -1, dtype=np.int64),
        "session_id": np.arange(count, dtype=np.int64),
    }
    non_tensors = {k: np.concatenate([v, extra.get(k, np.array([v[0]] * count, dtype=v.dtype))]) for k, v in nt.items()}
    non_tensors["is_padding"] = np.array([False] * len(batch) + [True] * count, dtype=bool)
    tensors = {k: torch.cat([v, synthetic[k]]) for k, v in real.items()}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=dict(batch.meta_info))


def balance(lengths: Sequence[int], dp_size: int) -> tuple[list[list[int]], dict]:
    """Always-on v1 ``_balance_batch`` on the padded batch: KK equal-size partitions kept in ascending batch index,
    and ``global_seqlen/*`` measured on the padded, pre-reorder batch. Mirrors PPOTrainer._balance_batch (v1)."""
    parts = v1_partitions(lengths, dp_size)
    return parts, log_seqlen_unbalance(lengths, parts, "global_seqlen")


def real_rows(batch: DataProto) -> list[int]:
    """Indices of the non-padding rows (verl's data metrics select ``not tag["is_padding"]``)."""
    flags = batch.non_tensor_batch.get("is_padding")
    return list(range(len(batch))) if flags is None else [i for i, f in enumerate(flags) if not f]


def driver_stages(v1: V1Batch, prompts: int, rollout_n: int, rows: int) -> list:
    """The v1 driver stages of the live trace (dataloader, agent-loop split, replay buffer, padding), in the
    planner's names, so the live step reads like ``plan()`` for the same config."""
    from labkit.trace import StageRecord

    split = v1.prompts_per_worker
    agent = StageRecord(
        "agent_loop",
        "agent-loop split",
        prompts,
        "prompts",
        split[0] if len(set(split)) == 1 else None,
        f"{','.join(map(str, split))} prompts = {','.join(str(k * rollout_n) for k in split)} sessions",
    )
    return [
        StageRecord("dataloader", "dataloader batch", prompts, "prompts"),
        agent,
        StageRecord("replay_buffer", "replay buffer (completion order)", prompts * rollout_n, "samples"),
        StageRecord("padding", "synthetic padding rows", rows, "samples", note=f"{v1.padding_rows} padding rows"),
    ]
