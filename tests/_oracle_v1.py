"""verl 0.9.1's v1 loop as a test oracle, run in a subprocess: reads a JSON list of jobs on stdin, prints answers.

Runs verl's own ``PPOTrainer._get_required_batch_multiple`` and ``PPOTrainer._balance_batch`` (with
``upsample_batch_to_divisible_size``), the sync ``ReplayBuffer.sample``, TransferQueue's ``KVBatchMeta.chunk``,
``tensordict_utils.make_iterator``, ``prepare_micro_batches`` (static) and ``agg_loss``, with small stand-ins for
TransferQueue's store and the worker group. Needs the packages the Makefile installs into .oracle/verl-0.9.1-v1.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / ".oracle" / "verl-0.9.1-v1"))  # after the venv: only the missing packages come from it
logging.disable(logging.WARNING)

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo import core_algos, padding_utils  # noqa: E402
from verl.trainer.ppo.v1 import replay_buffer  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402

EOS = 7


class FakeStore:
    """What padding_utils and the replay buffer call on TransferQueue: samples by key, tags in insertion order."""

    def __init__(self, samples: dict[str, dict], listing: dict | None = None) -> None:
        self.samples, self.listing, self.cleared = samples, listing, []

    def kv_batch_get(self, keys, partition_id):
        return [self.samples[k] for k in keys]

    def kv_batch_put(self, keys, partition_id, fields, tags):
        return None

    def kv_list(self):
        return self.listing

    def kv_clear(self, partition_id, keys):
        self.cleared.extend(keys)


def _sample(prompt_len: int, response_len: int) -> dict:
    ids = torch.arange(prompt_len + response_len, dtype=torch.int64)
    return {
        "prompts": ids[:prompt_len],
        "responses": ids[prompt_len:],
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "response_mask": torch.ones(response_len, dtype=torch.int64),
    }


def _stub(job: dict) -> types.SimpleNamespace:
    config = OmegaConf.create(
        {
            "critic": {"ppo_mini_batch_size": job["critic_mini"] or 1},
            "trainer": {"critic_warmup": job["warmup"]},
            "actor_rollout_ref": {"rollout": {"n": job["n"]}, "actor": {"ppo_mini_batch_size": job["mini"]}},
        }
    )
    stub = types.SimpleNamespace(
        config=config,
        use_critic=job["critic_mini"] is not None,
        global_steps=job.get("step", 1),
        actor_rollout_ref=None,
        actor_rollout_wg=types.SimpleNamespace(_dispatch_info={"actor": list(range(job["dp"]))}),
        tokenizer=types.SimpleNamespace(eos_token_id=EOS),
    )
    stub._get_required_batch_multiple = types.MethodType(PPOTrainer._get_required_batch_multiple, stub)
    return stub


def balance(job: dict) -> dict:
    """Required multiple, padded + balanced key order, metrics, TQ chunks, mini-batches and static micro-batches."""
    rows = job["rows"]  # [prompt, session, prompt_len, response_len] in completion order
    keys = [f"u{p}_{s}_0" for p, s, _, _ in rows]
    tags = [{"status": "success", "prompt_len": a, "response_len": b, "seq_len": a + b} for _, _, a, b in rows]
    padding_utils.tq = FakeStore({k: _sample(a, b) for k, (_, _, a, b) in zip(keys, rows, strict=True)})
    stub = _stub(job)
    multiple = stub._get_required_batch_multiple(job["dp"])
    metrics: dict = {}
    batch = PPOTrainer._balance_batch(stub, KVBatchMeta(partition_id="train", keys=keys, tags=tags), metrics)
    rename = {}
    for k in batch.keys:
        if k.startswith("pad"):
            rename[k] = f"pad_{k.split('_')[1]}"
    order = [rename.get(k, k) for k in batch.keys]
    chunks = [[rename.get(k, k) for k in c.keys] for c in batch.chunk(job["dp"])]
    out = {"multiple": multiple, "order": order, "chunks": chunks, "metrics": metrics}
    per_rank = len(chunks[0])
    mini = job["mini"] * job["n"] // job["dp"] if job["mini"] * job["n"] % job["dp"] == 0 else None
    if mini and per_rank % mini == 0:
        td = TensorDict({"pos": torch.arange(per_rank)}, batch_size=[per_rank])
        it = tu.make_iterator(td, mini, 1, seed=42, dataloader_kwargs={"shuffle": False})
        out["minis"] = [b["pos"].tolist() for b in it]
    if job.get("micro"):
        td = TensorDict({"pos": torch.arange(per_rank)}, batch_size=[per_rank])
        tu.assign_non_tensor_data(td, "use_dynamic_bsz", False)
        tu.assign_non_tensor_data(td, "micro_batch_size_per_gpu", job["micro"])
        try:
            micro, _ = prepare_micro_batches(td)
            out["micro"] = [m["pos"].tolist() for m in micro]
        except AssertionError as exc:
            out["micro_error"] = ["AssertionError", str(exc)]
    return out


def replay(job: dict) -> dict:
    """The sync replay buffer's batch for B terminal groups whose surviving trajectories registered in ``order``
    (a group with a failed session is tagged "failure", as the agent loop tags it); verl's error when none has any."""
    failed = set(job.get("failed_groups", []))
    listing = {
        f"u{p}": {"is_prompt": True, "status": "failure" if p in failed else "finished", "global_steps": 1}
        for p in range(job["prompts"])
    }
    for p, s in job["order"]:
        listing[f"u{p}_{s}_0"] = {"status": "success", "global_steps": 1}
    replay_buffer.tq = FakeStore({}, {"train": listing})
    buf = replay_buffer.ReplayBuffer("sync", OmegaConf.create({}), None, "drop", OmegaConf.create({}))
    try:
        batch, _ = buf.sample(global_steps=1, partition_id="train", batch_size=job["prompts"])
    except RuntimeError as exc:
        return {"error": ["RuntimeError", str(exc)]}
    return {"keys": list(batch.keys)}


def agg(job: dict) -> dict:
    """verl's agg_loss on one micro-batch with the v1 loop's global denominators."""
    loss = torch.tensor(job["loss"], dtype=torch.float64)
    mask = torch.tensor(job["mask"], dtype=torch.float64)
    value = core_algos.agg_loss(
        loss,
        mask,
        job["mode"],
        dp_size=job["dp"],
        batch_num_tokens=job["tokens"],
        global_batch_size=job["global_batch_size"],
        loss_scale_factor=job.get("factor"),
    )
    return {"value": float(value)}


def chunk(job: dict) -> dict:
    meta = KVBatchMeta(partition_id="train", keys=[str(i) for i in range(job["rows"])], tags=[{}] * job["rows"])
    return {"sizes": [len(c) for c in meta.chunk(job["k"])]}


def next_batch(job: dict) -> dict:
    """verl's _next_train_batch check on train_batch_size and gen_batch_size (it raises before any fetch)."""
    data = {"train_batch_size": job["train_batch_size"], "gen_batch_size": job["gen_batch_size"]}
    stub = types.SimpleNamespace(config=OmegaConf.create({"data": data}), global_steps=1)
    stub._fetch_one_gen_batch = lambda: TensorDict({}, batch_size=[job["gen_batch_size"] or job["train_batch_size"]])
    try:
        PPOTrainer._next_train_batch(stub)
    except ValueError as exc:
        return {"error": ["ValueError", str(exc)]}
    except Exception:  # noqa: BLE001 - past the check, the stand-in dataloader is not verl's concern here
        pass
    return {"error": None}


KINDS = {"balance": balance, "replay": replay, "agg": agg, "chunk": chunk, "next_batch": next_batch}

if __name__ == "__main__":
    jobs = json.loads(sys.stdin.read())
    print(json.dumps([KINDS[j["kind"]](j) for j in jobs]))
