"""verl 0.9.1's v1 step (``trainer.use_v1=true``) live on 4 CPU ranks: 7 prompts split 2,2,2,1 over 4 agent-loop
workers, n=4 sessions each, rows in the order the live rollout finished them, 4 synthetic padding rows (required
multiple lcm(4, 4·4) = 16: 28 → 32), the always-on KK balance. The live trace equals ``plan(cfg, lengths,
completion_order=...)`` stage by stage, and the step's loss and gradient norm equal the same loss computed on the
driver without the padding rows (lr 0, so every mini-batch sees the same weights)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from labkit.rules.geometry import ARR
from labkit.rules.v1_loop import SYNTHETIC_PADDING_SEQ_LEN
from labkit.runtime.worker_group import live_groups
from labkit.trace import compare
from labkit.trainer.grpo_trainer import GRPOTrainer
from labkit.trainer.live_trace import FIELDS

V1 = [
    "trainer.use_v1=true",
    "data.train_batch_size=7",
    f"{ARR}.actor.ppo_mini_batch_size=4",
    f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
    f"{ARR}.actor.entropy_coeff=0.01",  # an entropy bonus: every mini-batch has a loss and a gradient
    f"{ARR}.rollout.name=hf",  # the HF engine: this module is about the v1 step, not the vLLM engine
]


def test_v1_config_the_live_rollout_cannot_split_fails_before_any_process():
    with pytest.raises(ValueError, match=r"B·n = 21 sessions to the 4 rollout replicas"):
        GRPOTrainer([*V1, f"{ARR}.rollout.n=3"], launcher="local")
    assert live_groups() == []


@pytest.fixture(scope="module")
def step():
    tr = GRPOTrainer(V1, launcher="local", seed=0, lr=0.0, progress=False, fixed_prompts=True)
    try:
        metrics = tr.step()
        full = tr.wg.full_params()[0]
        yield tr, metrics, tr.trace, tr.prediction(), tr.batch, full
    finally:
        tr.close()
    assert tr.wg.alive_pids() == [] and live_groups() == []


def test_live_v1_trace_equals_the_plan(step):
    tr, metrics, trace, predicted, batch, _ = step
    assert trace.summary["loop"] == "v1" and predicted.summary["loop"] == "v1"
    assert predicted.summary["ok"], predicted.summary["stage_errors"]
    mismatches = compare(predicted, trace, stages=["balance", "old_log_prob", "update_actor"], fields=FIELDS)
    assert mismatches == [], "\n".join(map(str, mismatches))
    assert [r.extra["indices"] for r in trace.at("balance")] == [r.extra["indices"] for r in predicted.at("balance")]
    seqlen = {k: v for k, v in metrics.items() if k.startswith("global_seqlen/")}
    assert seqlen == predicted.summary["global_seqlen"]
    # the uneven agent-loop split and the padding are the planner's
    split = trace.summary["agent_loop"]["prompts_per_worker"]
    assert split == predicted.summary["agent_loop"]["prompts_per_worker"] == [2, 2, 2, 1]
    assert trace.summary["v1_padding"]["padding_rows"] == predicted.summary["padding_rows"] == 4
    assert len(batch) == predicted.summary["samples"] == 32
    # non-trivial: every rank ran 2 mini-batches of 2 micro-batches, and the padding rows reached the ranks
    assert all(r.mini_batches == [4, 4] and r.n_micro == 4 for r in trace.at("update_actor"))
    assert sum(r.extra["padding_rows"] for r in predicted.at("balance")) == 4
    assert sum(r.tokens for r in trace.at("old_log_prob")) == int(batch.batch["attention_mask"].sum())
    assert metrics["perf/total_num_tokens"] == int(batch.batch["attention_mask"].sum())  # v1 counts padding


def test_rows_follow_completion_order_and_padding_rows_are_masked(step):
    tr, _, trace, _, batch, _ = step
    order, ends = trace.summary["completion_order"], trace.summary["end_steps"]
    assert sorted(order) == list(range(28)) and order != list(range(28))  # a real reordering happened
    assert [ends[i] for i in order] == sorted(ends)  # sorted by the decoding step at which each row ended
    # ranks hold their rows in ascending batch index (KK order, no re-sort), padding rows (indices 28..31) last
    parts = tr.v1.partitions
    assert all(p == sorted(p) for p in parts) and sorted(i for p in parts for i in p) == list(range(32))
    pad = batch.non_tensor_batch["is_padding"]
    assert int(pad.sum()) == 4
    b = batch.batch
    assert (b["attention_mask"][pad].sum(-1) == SYNTHETIC_PADDING_SEQ_LEN).all()
    assert (
        int(b["response_mask"][pad].sum()) == 0
        and int(b["position_ids"][pad][b["attention_mask"][pad] > 0].max()) == 127
    )
    assert float(b["advantages"][pad].abs().sum()) == 0 and float(b["token_level_scores"][pad].abs().sum()) == 0
    assert len(set(batch.non_tensor_batch["uid"][pad])) == 1
    # the n sessions of a prompt stay in one agent-loop worker
    real = ~pad
    by_uid: dict = {}
    for u, w in zip(batch.non_tensor_batch["uid"][real], batch.non_tensor_batch["agent_worker"][real], strict=True):
        by_uid.setdefault(u, set()).add(int(w))
    assert len(by_uid) == 7 and all(len(ws) == 1 for ws in by_uid.values())


def test_padding_changes_neither_the_loss_nor_the_gradient(step):
    """Per global mini-batch: the token-mean PPO loss and its gradient on the real rows alone (one process, full
    model) equal the live ranks' actor/pg_loss and actor/grad_norm, whose mini-batches carried the padding rows."""
    from labkit.model.logprob import forward_micro_batch
    from labkit.rl.algo import agg_loss, policy_loss_vanilla
    from labkit.rl.rollout import load_rollout_model

    tr, metrics, _, _, batch, full = step
    model, _ = load_rollout_model(None, "float32")
    for name, p in model.named_parameters():
        p.data.copy_(torch.from_numpy(full[name]))
    s, D, per_rank = tr.settings, 4, len(batch) // 4
    mini = s.ppo_mini_batch_size * s.rollout_n // D
    pad = batch.non_tensor_batch["is_padding"]
    losses, norms = [], []
    for j in range(per_rank // mini):
        rows = [r * per_rank + j * mini + i for r in range(D) for i in range(mini)]
        real = [i for i in rows if not pad[i]]
        assert len(real) < len(rows) or j == 0  # the last mini-batch of each rank holds its padding row
        sub = {k: v[real] for k, v in batch.batch.items()}
        log_prob, entropy = forward_micro_batch(
            model, sub, use_remove_padding=True, temperature=batch.meta_info["temperature"], calculate_entropy=True
        )
        mask = sub["response_mask"]
        pg, _ = policy_loss_vanilla(
            sub["old_log_probs"], log_prob, sub["advantages"], mask, loss_agg_mode="token-mean",
            clip_ratio=s.clip_ratio, clip_ratio_low=s.clip_ratio_low, clip_ratio_high=s.clip_ratio_high,
            clip_ratio_c=s.clip_ratio_c, profile="engine",
        )  # fmt: skip
        ent = agg_loss(entropy, mask, "token-mean", profile="engine")  # local denominators: the real tokens only
        loss = pg - s.entropy_coeff * ent
        model.zero_grad()
        loss.backward()
        losses.append((float(pg.detach()), float(ent.detach()), float(loss.detach())))
        norms.append(math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters())))
    print(f"\nper mini-batch (pg, entropy, loss) {losses}, grad norm {norms}; live pg {metrics['actor/pg_loss']}, "
          f"entropy {metrics['actor/entropy_loss']}, loss {metrics['actor/loss']}, grad norm {metrics['actor/grad_norm']}")  # fmt: skip
    pg, ent, total = np.mean(losses, axis=0)
    assert min(norms) > 0 and ent > 0.1
    assert metrics["actor/pg_loss"] == pytest.approx(pg, rel=1e-5, abs=1e-7)
    assert metrics["actor/entropy_loss"] == pytest.approx(ent, rel=1e-5)
    assert metrics["actor/loss"] == pytest.approx(total, rel=1e-5, abs=1e-7)
    assert metrics["actor/grad_norm"] == pytest.approx(np.mean(norms), rel=1e-5)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_v1_micro_batch_loss_equals_verls_agg_loss_on_nested_rows(mode):
    """A v1 micro-batch with padding rows: labkit's loss (global denominators, v1 horizon) equals verl 0.9.1's
    agg_loss on the same rows padded only to their longest response (what v1's nested tensors give), and equals the
    loss of the micro-batch without its padding rows (global denominators fixed by the mini-batch)."""
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from labkit.protocol.data_proto import DataProto
    from labkit.rl.actor_update import _v1_horizon
    from labkit.rl.algo import agg_loss

    g = torch.Generator().manual_seed(3)
    R, resp = 12, torch.tensor([5, 9, 3, 7])  # 4 real rows, then 2 padding rows (1 response token, mask 0)
    real_mask = (torch.arange(R)[None, :] < resp[:, None]).long()
    pad_attn = torch.zeros(2, R, dtype=torch.long)
    pad_attn[:, 0] = 1
    attn = torch.cat([torch.ones(6, 4, dtype=torch.long), torch.cat([real_mask, pad_attn])], 1)
    mask = torch.cat([real_mask, torch.zeros(2, R, dtype=torch.long)])
    loss_mat = torch.randn(6, R, generator=g, dtype=torch.float64)
    batch = {"responses": torch.zeros(6, R, dtype=torch.long), "attention_mask": attn}
    data = DataProto.from_dict(tensors={"x": torch.zeros(6)}, meta_info={"loss_horizon": "micro_batch"})
    base = {"dp_size": 2, "batch_num_tokens": 50, "global_batch_size": 16, "loss_scale_factor": None}
    info = _v1_horizon(base, data, batch, mode)
    ours = agg_loss(loss_mat, mask, mode, profile="engine", **info)
    h = int(resp.max())
    theirs = core_algos.agg_loss(loss_mat[:, :h], mask[:, :h], mode, **base)
    without = agg_loss(loss_mat[:4], mask[:4], mode, profile="engine", **info)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-12) and float(ours) == pytest.approx(float(without))
    if mode == "seq-mean-token-sum-norm":  # the v0 horizon (the tensor width) would differ
        assert info["loss_scale_factor"] == h and float(agg_loss(loss_mat, mask, mode, profile="engine", **base)) != (
            pytest.approx(float(theirs))
        )
