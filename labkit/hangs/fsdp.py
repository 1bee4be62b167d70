"""Hang (a) on the training actor itself: FSDP2 shards of a tiny Qwen2 over 2 ranks, dynamic micro-batches, and
the MAX sync skipped as verl 0.7.1's ``dp_actor`` skips it (it passes no ``dp_group``, issue #5750). The heavier
rank's next FSDP parameter all-gather has no partner; gloo ends it after the collective timeout and the rank reports
the stage, the micro-batch and the torch collective it failed in. The same run with the sync completes.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from labkit.config.keys import ARR
from labkit.config.verl_config import load_config
from labkit.hangs.diagnosis import diagnose, timeline
from labkit.hangs.reproduce import WORLD, FixedRun, HangRun
from labkit.plan.hang_risk import FIX, unsynced_counts
from labkit.plan.step import plan
from labkit.protocol.data_proto import DataProto
from labkit.rl.actor import ActorWorker
from labkit.rl.actor_math import ActorSettings
from labkit.runtime import dist, process_group
from labkit.runtime.worker import Dispatch, register
from labkit.runtime.worker_group import WorkerGroup

MODEL = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
PROMPT = RESPONSE = 8
BUDGET = PROMPT + RESPONSE  # log_prob_max_token_len_per_gpu: legacy needs it >= the padded width
LENGTHS = [16] * 4 + [4] * 4  # dp_rank 0 then dp_rank 1: k alone 4 and 1


class FSDPHangWorker(ActorWorker):
    """The training actor, returning what its log-prob pass did instead of raising (the lab's convention)."""

    @register(Dispatch.ONE_TO_ALL)
    def log_prob_stage(self, data: DataProto) -> dict[str, Any]:
        """compute_log_prob on this DP rank's chunk; on a failed collective: where it failed, and the counts so far."""
        chunk = data.chunk(self.dp_size)[self.dp_rank]
        t0, since, before = time.time(), dist.log_length(), dist.collective_counts()
        out = {"rank": self.rank, "dp_rank": self.dp_rank, "stage": "old_log_prob", "error": None, "report": None}
        try:
            self._log_prob(self.model, chunk, "actor", calculate_entropy=False)
        except RuntimeError as exc:  # FSDP's own all-gather timed out (gloo): the peer never entered it
            report = dist.report_for(exc)
            after = dist.collective_counts()
            counts = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            entered = (report["micro_batch"] or 0) + 1  # the forward it failed in, and those before it
            out.update(outcome="timeout", error=str(exc)[:300], report=report, micro_batches=entered)
            out["counts"] = {**counts, "all_gather(params)": entered - 1}  # completed; the diagnosis adds the wait
            # gloo gives up after the group's timeout ("Timed out waiting ...ms")
            waited = process_group.state().timeout_s
            report.update(waiting_in="all_gather(params)", call=entered, waited_s=waited)
            with dist.where("old_log_prob", entered - 1):
                dist.note("all_gather(params)", "timeout", time.time() - waited)
        else:
            rec = self.records.pop()
            out.update(outcome="ok", counts=dict(rec["collectives"]), micro_batches=len(rec["micro_batches"]))
            with dist.where("old_log_prob"):
                dist.note("return", "ok", time.time())
        out.update(elapsed_s=time.time() - t0, log=dist.collective_log(since))
        return out


def batch() -> DataProto:
    """8 rows, prompts left-padded to 8 tokens and responses right-padded to 8, with the valid lengths of LENGTHS."""
    rng = np.random.default_rng(0)
    ids = np.zeros((len(LENGTHS), PROMPT + RESPONSE), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, length in enumerate(LENGTHS):
        p = min(PROMPT, length // 2)
        ids[i, PROMPT - p : PROMPT - p + length] = rng.integers(1, MODEL["vocab_size"], size=length)
        mask[i, PROMPT - p : PROMPT - p + length] = 1
    t = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    t["position_ids"] = torch.from_numpy(np.clip(np.cumsum(mask, 1) - 1, 0, None))
    t["responses"] = t["input_ids"][:, PROMPT:].clone()
    return DataProto.from_dict(tensors=t, meta_info={"temperature": 1.0})


def settings(sync: bool) -> ActorSettings:
    """Legacy actor, dynamic log-prob micro-batches under BUDGET tokens, the sync on or skipped."""
    return ActorSettings(
        profile="legacy",
        model_config=MODEL,
        ppo_mini_batch_size=len(LENGTHS),
        ppo_micro_batch_size_per_gpu=1,
        log_prob_use_dynamic_bsz=True,
        log_prob_max_token_len_per_gpu=BUDGET,
        extra={"skip_dp_sync": not sync},
    )


def _run(sync: bool, timeout_s: float) -> tuple[list[dict], list[int], float]:
    t0 = time.monotonic()
    s = settings(sync)
    wg = WorkerGroup(
        FSDPHangWorker,
        WORLD,
        launcher="local",
        init_kwargs=s.as_dict(),
        collective_timeout_s=timeout_s,
        profile="legacy",
    )
    try:
        wg.init_model()
        results = wg.log_prob_stage(batch())
    finally:
        wg.close()
    return list(results), wg.alive_pids(), time.monotonic() - t0


def fsdp_unsynced_dynamic_bsz(timeout_s: float = 3.0, fix: bool = True) -> HangRun:
    """(a) on the real actor: rank 0 holds 4 rows of 16 tokens, rank 1 4 rows of 4, budget 16; without the sync
    rank 0 cuts 4 micro-batches, rank 1 one, and rank 0's second forward waits in FSDP's all-gather."""
    results, left, elapsed = _run(False, timeout_s)
    per_rank = [LENGTHS[:4], LENGTHS[4:]]
    alone = unsynced_counts(per_rank, BUDGET, "legacy", BUDGET)
    diag = diagnose(
        "a",
        "FSDP2 actor without the DP MAX sync",
        results,
        FIX["a"],
        f"micro-batches per rank without the sync {alone}",
    )
    run = HangRun(diag, results, timeline(results), elapsed, timeout_s, left)
    if fix:
        fixed, _, _ = _run(True, timeout_s)
        cfg = load_config(
            overrides=[
                f"trainer.n_gpus_per_node={WORLD}",
                "algorithm.adv_estimator=grpo",
                "trainer.balance_batch=false",
                f"data.train_batch_size={len(LENGTHS)}",
                f"{ARR}.rollout.n=1",
                f"data.max_prompt_length={PROMPT}",
                f"data.max_response_length={RESPONSE}",
                f"{ARR}.actor.ppo_mini_batch_size={len(LENGTHS)}",
                f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1",
                f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=1",
                f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=1",
                f"{ARR}.rollout.log_prob_use_dynamic_bsz=true",
                f"{ARR}.rollout.log_prob_max_token_len_per_gpu={BUDGET}",
            ],
            profile="legacy",
        )
        trace = plan(cfg, LENGTHS)
        run.fixed = FixedRun(
            completed=all(r["outcome"] == "ok" for r in fixed),
            observed={r["rank"]: r["counts"] for r in fixed},
            predicted={r.rank: dict(r.collectives) for r in trace.at("old_log_prob")},
            results=fixed,
        )
    return run
