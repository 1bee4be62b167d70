"""The legacy update against verl 0.7.1's own DataParallelPPOActor.update_policy (dp_actor.py), run in one subprocess
with PYTHONPATH on the unpacked 0.7.1 source: one gloo rank, the tiny fp32 Qwen2 of tests/_actor_ref.py, SGD lr 1,
off-policy (old/ref log-probs perturbed), 2 mini-batches × 2 epochs. labkit's run_update runs on a stand-in worker
from the same initial weights; the updated parameters and the reduced metrics (verl's reduce_metrics vs
labkit.rl.actor_math.reduce_legacy) must agree. Cases: token-mean static with entropy_coeff ≠ 0 (0.7.1 logs pg_loss
after its in-place −entropy_coeff·entropy), seq-mean-token-mean with use_dynamic_bsz, seq-mean-token-sum-norm static
with k3 KL and no entropy bonus.

Run as a script (``python tests/test_actor_parity.py``), this file is the oracle side: it prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORACLE_071 = ROOT / ".oracle" / "verl-0.7.1"
MARK = "PARITY_JSON "
CASES = [
    dict(
        name="token-mean static, entropy bonus",
        loss_agg_mode="token-mean",
        entropy_coeff=0.01,
        dyn=False,
        kl_loss_type="low_var_kl",
    ),
    dict(
        name="seq-mean-token-mean dynamic bsz",
        loss_agg_mode="seq-mean-token-mean",
        entropy_coeff=0.02,
        dyn=True,
        kl_loss_type="low_var_kl",
    ),
    dict(
        name="seq-mean-token-sum-norm static, no bonus",
        loss_agg_mode="seq-mean-token-sum-norm",
        entropy_coeff=0.0,
        dyn=False,
        kl_loss_type="k3",
    ),
]


def _oracle_case(case: dict) -> dict:
    """verl 0.7.1's update_policy and labkit's run_update from the same weights and batch."""
    import copy
    import types

    import torch
    from _actor_ref import TEMPERATURE, base_settings, make_batch
    from verl import DataProto as VerlDataProto
    from verl.utils.metric import reduce_metrics
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config import FSDPEngineConfig
    from verl.workers.config.actor import FSDPActorConfig

    from labkit.model.logprob import forward_micro_batch
    from labkit.protocol.data_proto import DataProto
    from labkit.rl.actor import ActorWorker
    from labkit.rl.actor_math import reduce_legacy
    from labkit.rl.actor_model import build_model
    from labkit.rl.actor_update import run_update

    keys = dict(
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        ppo_epochs=2,
        loss_agg_mode=case["loss_agg_mode"],
        entropy_coeff=case["entropy_coeff"],
        use_kl_loss=True,
        kl_loss_coef=0.1,
        kl_loss_type=case["kl_loss_type"],
        clip_ratio_low=0.1,
        clip_ratio_high=0.15,
        use_dynamic_bsz=case["dyn"],
        ppo_max_token_len_per_gpu=40,
    )
    s = base_settings(profile="legacy", use_remove_padding=False, chunked_logprob=False, **keys)
    data = make_batch()
    m0 = build_model(s)
    with torch.no_grad():
        lp, _ = forward_micro_batch(
            m0,
            {k: data.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")},
            use_remove_padding=False,
            temperature=TEMPERATURE,
        )
    g = torch.Generator().manual_seed(3)
    data.batch["old_log_probs"] = lp + 0.2 * torch.randn(lp.shape, generator=g)  # off-policy: ratios ≠ 1, clipping
    data.batch["ref_log_prob"] = lp + 0.3 * torch.randn(lp.shape, generator=g)

    mv = copy.deepcopy(m0)
    cfg = FSDPActorConfig(
        strategy="fsdp",
        rollout_n=1,
        use_torch_compile=False,
        grad_clip=1e9,
        fsdp_config=FSDPEngineConfig(dtype="float32"),
        **keys,
    )
    actor = DataParallelPPOActor(cfg, mv, torch.optim.SGD(mv.parameters(), lr=1.0))
    verl_metrics = actor.update_policy(
        VerlDataProto.from_dict(
            tensors={k: v.clone() for k, v in data.batch.items()}, meta_info={"temperature": TEMPERATURE}
        )
    )

    ml = copy.deepcopy(m0)
    w = types.SimpleNamespace(
        s=s,
        rank=0,
        dp_rank=0,
        dp_size=1,
        model=ml,
        mini_legacy=4,
        records=[],
        optimizer=torch.optim.SGD(ml.parameters(), lr=1.0),
        device=torch.device("cpu"),
        sp_group=None,
        dp_group=None,
    )
    w._temperature = lambda d: float(d.meta_info["temperature"])
    w._rmpad = lambda: False
    w._pad_to_longest = lambda: False
    w._dynamic_parts = lambda rec, d, b: ActorWorker._dynamic_parts(w, rec, d, b)
    mine = run_update(
        w,
        DataProto.from_dict(
            tensors={k: v.clone() for k, v in data.batch.items()}, meta_info={"temperature": TEMPERATURE}
        ),
    ).meta_info["metrics"]
    return {
        "verl": {
            k: float(v)
            for k, v in reduce_metrics({k: v if isinstance(v, list) else [v] for k, v in verl_metrics.items()}).items()
        },
        "labkit": reduce_legacy([mine]),
        "param_diff": max(float((a - b).abs().max()) for a, b in zip(mv.parameters(), ml.parameters())),
        "param_step": max(float((a - b).abs().max()) for a, b in zip(mv.parameters(), m0.parameters())),
    }


def _oracle_main() -> None:
    import torch
    import torch.distributed as tdist

    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
    torch.set_num_threads(1)
    import verl

    assert str(ORACLE_071) in verl.__file__, verl.__file__
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", sys.argv[1])
    tdist.init_process_group("gloo", rank=0, world_size=1)
    try:
        print(MARK + json.dumps([_oracle_case(c) for c in CASES]), flush=True)
    finally:
        tdist.destroy_process_group()


@pytest.fixture(scope="module")
def parity() -> list[dict]:
    if not (ORACLE_071 / "verl").is_dir():
        pytest.skip(f"verl 0.7.1 oracle missing at {ORACLE_071} (run `make venv` to unpack it)")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ORACLE_071), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, __file__, str(port)], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith(MARK)]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-4000:])
    return json.loads(lines[-1][len(MARK) :])


@pytest.mark.parametrize("i", range(len(CASES)), ids=[c["name"] for c in CASES])
def test_legacy_update_matches_verl_071_update_policy(parity, i):
    res = parity[i]
    theirs, mine = res["verl"], res["labkit"]
    assert set(theirs) == set(mine) - {"actor/lr"}  # actor/lr is added by the 0.7.1 fsdp worker, not update_policy
    assert res["param_step"] > 1e-2  # the update really moves the weights
    assert res["param_diff"] < 5e-5 * max(1.0, res["param_step"]), res  # fp32 summation order
    for k in sorted(theirs):
        assert mine[k] == pytest.approx(theirs[k], rel=2e-5, abs=2e-6), (k, mine[k], theirs[k])


if __name__ == "__main__":
    _oracle_main()
