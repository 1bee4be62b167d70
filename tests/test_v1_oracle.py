"""The v1 loop's plan against verl 0.9.1's own v1 functions, on random configs and length sets (one oracle subprocess,
tests/_oracle_v1.py): required multiple and padding rows, rows and their order per DP rank after ``_balance_batch``,
the ``global_seqlen/*`` metrics, mini- and static micro-batch membership, the replay buffer's completion order,
TransferQueue's uneven chunks, and ``agg_loss`` with padding rows. Also the issue's checks on the seeds' example."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labkit.config.verl_config import SEED_EXAMPLE, load_config
from labkit.plan.step import plan
from labkit.rl import algo
from labkit.rules.v1_loop import agent_loop_split, batch_meta_chunks

ROOT = Path(__file__).resolve().parent.parent
ORACLE_V1 = ROOT / ".oracle" / "verl-0.9.1-v1"
ARR = "actor_rollout_ref"
N_BALANCE, N_REPLAY, N_AGG, N_CHUNK, N_FETCH = 220, 150, 300, 200, 120
MAX_ROWS = 1200  # padded rows per config: verl deep-copies every padding row (about 0.2 ms each)


def _random_case(rng: random.Random) -> dict | None:
    W = rng.choice([1, 2, 3, 4, 6, 8])
    sp = rng.choice([d for d in (1, 2) if W % d == 0])
    D, n, B = W // sp, rng.randint(1, 8), rng.randint(1, 24)
    M = rng.randint(1, B)
    critic = rng.choice([None, None, rng.randint(1, B)])
    warm = rng.choice([0, 0, 1, 2, rng.randint(3, 6)])
    step = rng.randint(1, warm + 5)  # steps 1..critic_warmup + 5: before and after the first actor update
    failed = sorted(rng.sample(range(B * n), rng.randint(1, B * n - 1))) if B * n > 1 and rng.random() < 0.3 else []
    alive = B * n - len(failed)
    multiple = math.lcm(D, *([critic * n] if critic else []), *([M * n] if warm <= step else []))
    if alive + (-alive % multiple) > MAX_ROWS:
        return None
    width = 256
    lens = [rng.choice([rng.randint(2, width), rng.randint(2, 12), 40]) for _ in range(B * n)]  # ties on purpose
    order = [i for i in range(B * n) if i not in set(failed)]
    rng.shuffle(order)  # a completion order of the surviving sessions
    micro = rng.choice([1, 2, 4, 5, 8])
    ov = [
        f"data.train_batch_size={B}",
        f"{ARR}.rollout.n={n}",
        f"trainer.n_gpus_per_node={W}",
        f"{ARR}.rollout.tensor_model_parallel_size=1",
        f"{ARR}.actor.ulysses_sequence_parallel_size={sp}",
        f"{ARR}.actor.ppo_mini_batch_size={M}",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"{ARR}.rollout.agent.num_workers={rng.randint(1, 8)}",
        f"trainer.critic_warmup={warm}",
        f"trainer.balance_batch={rng.random() < 0.7}",
        "data.max_prompt_length=128",
        "data.max_response_length=128",
        "trainer.use_v1=true",
    ]
    ov += (
        ["algorithm.adv_estimator=gae", f"critic.ppo_mini_batch_size={critic}"]
        if critic
        else ["algorithm.adv_estimator=grpo"]
    )
    split = [rng.randint(1, x - 1) if x > 1 else 1 for x in lens]  # prompt/response split of each row
    rows = [[i // n, i % n, split[i], lens[i] - split[i]] for i in order]
    job = {"kind": "balance", "dp": D, "n": n, "mini": M, "critic_mini": critic, "warmup": warm, "micro": micro}
    job["step"] = step
    return {"overrides": ov, "lens": lens, "order": order, "step": step, "failed": failed, "job": {**job, "rows": rows}}


def _targeted_case(rng: random.Random) -> dict:
    """B=334, n=8, D=8, M=1, a critic with Mc=261: lcm(8, 2088, 8) = 2088 → 1,504 padding rows, 522 rows per rank;
    the padding fills whole actor mini-batches of one row per rank."""
    B, n, W = 334, 8, 8
    lens = [rng.randint(2, 256) for _ in range(B * n)]
    ov = [
        f"data.train_batch_size={B}",
        f"{ARR}.rollout.n={n}",
        f"trainer.n_gpus_per_node={W}",
        f"{ARR}.rollout.tensor_model_parallel_size=1",
        f"{ARR}.actor.ppo_mini_batch_size=1",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=2",
        "data.max_prompt_length=128",
        "data.max_response_length=128",
        "algorithm.adv_estimator=gae",
        "critic.ppo_mini_batch_size=261",
        "trainer.use_v1=true",
    ]
    order = list(range(B * n))
    rows = [[i // n, i % n, 1, lens[i] - 1] for i in order]
    job = {"kind": "balance", "dp": W, "n": n, "mini": 1, "critic_mini": 261, "warmup": 0, "micro": 2}
    return {"overrides": ov, "lens": lens, "order": order, "job": {**job, "rows": rows}}


def _agg_case(rng: random.Random) -> dict:
    """One micro-batch of a v1 mini-batch: real rows, padding rows (1 response token, mask 0), nested widths."""
    real, pad = rng.randint(0, 6), rng.randint(0, 4)
    resp = [rng.randint(1, 9) for _ in range(real)] + [1] * pad
    width = max(resp, default=1)  # v1's rows are unpadded: the micro-batch is as wide as its longest response
    mask = [[1.0 if t < r else 0.0 for t in range(width)] for r in resp[:real]] + [[0.0] * width] * pad
    loss = [[round(rng.uniform(-3, 3), 3) for _ in range(width)] for _ in resp]
    local = int(sum(map(sum, mask)))
    tokens = local + rng.choice([0, 0, rng.randint(0, 40)])  # the all-reduced count over the DP group
    dp = rng.choice([1, 2, 4])
    return {
        "kind": "agg",
        "loss": loss or [[0.0]],
        "mask": mask or [[0.0]],
        "mode": rng.choice(list(algo.LOSS_AGG_MODES["engine"])),
        "dp": dp,
        "tokens": tokens,
        "global_batch_size": rng.randint(max(1, real + pad), 64),
    }


@pytest.fixture(scope="module")
def oracle():
    if not (ORACLE_V1 / "transfer_queue").is_dir():
        pytest.skip(f"{ORACLE_V1} is absent: make venv installs TransferQueue and verl's v1 imports there")
    rng = random.Random(20261201)
    cases = [_targeted_case(rng)]
    while len(cases) < N_BALANCE + 1:
        c = _random_case(rng)
        if c is not None:
            cases.append(c)
    replays = []
    for k in range(N_REPLAY):
        B, n = rng.randint(1, 12), rng.randint(1, 6)
        order = [[p, s] for p in range(B) for s in range(n)]
        rng.shuffle(order)
        roll = rng.random()  # failed sessions write no row: some of them, or (every 10th case) all of them
        lost = set(map(tuple, order)) if k % 10 == 9 else set(rng.sample(list(map(tuple, order)), len(order) // 3))
        lost = lost if roll < 0.5 or k % 10 == 9 else set()
        kept = [ps for ps in order if tuple(ps) not in lost]
        replays.append(
            {"kind": "replay", "prompts": B, "n": n, "order": kept, "failed_groups": sorted({p for p, _ in lost})}
        )
    aggs = [_agg_case(rng) for _ in range(N_AGG)]
    chunks = [{"kind": "chunk", "rows": rng.randint(0, 60), "k": rng.randint(1, 12)} for _ in range(N_CHUNK)]
    fetches = [
        {
            "kind": "next_batch",
            "train_batch_size": rng.randint(1, 64),
            "gen_batch_size": rng.choice([None, *range(1, 70)]),
        }
        for _ in range(N_FETCH)
    ]
    jobs = [c["job"] for c in cases] + replays + aggs + chunks + fetches
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_oracle_v1.py")],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    k = len(cases)
    return {
        "balance": list(zip(cases, answers[:k], strict=True)),
        "replay": list(zip(replays, answers[k : k + N_REPLAY], strict=True)),
        "agg": list(zip(aggs, answers[k + N_REPLAY : k + N_REPLAY + N_AGG], strict=True)),
        "chunk": list(zip(chunks, answers[k + N_REPLAY + N_AGG : len(answers) - N_FETCH], strict=True)),
        "fetch": list(zip(fetches, answers[len(answers) - N_FETCH :], strict=True)),
    }


def _key(tr, i: int) -> str:
    """verl's key of batch row i of a v1 plan: u{prompt}_{session}_0, or pad_{j} for the j-th padding row."""
    rows = tr.stage("replay_buffer").extra["rows"]
    return f"u{rows[i][0]}_{rows[i][1]}_0" if i < len(rows) else f"pad_{i - len(rows)}"


@pytest.mark.timeout(280)
def test_padding_balance_and_batches_equal_verls_v1_functions(oracle):
    padded = uneven_micro = minis_seen = micro_seen = all_padding = 0
    for case, want in oracle["balance"]:
        cfg = load_config(overrides=case["overrides"], profile="engine")
        tr = plan(
            cfg,
            case["lens"],
            completion_order=case["order"],
            global_step=case.get("step", 1),
            failed_sessions=case.get("failed", []),
        )
        s, ctx_why = tr.summary, case["overrides"]
        assert s["loop"] == "v1" and s["required_multiple"] == want["multiple"], ctx_why
        assert s["padding_rows"] == sum(k.startswith("pad_") for k in want["order"]), ctx_why
        padded += s["padding_rows"] > 0
        D = case["job"]["dp"]
        ranks = {r.dp_rank: r for r in tr.at("balance")}
        mine = [[_key(tr, i) for i in ranks[dp].extra["indices"]] for dp in range(D)]
        assert mine == want["chunks"], ctx_why  # the same rows per rank, in the same order
        assert s["global_seqlen"] == pytest.approx(want["metrics"]), ctx_why
        upd = {r.dp_rank: r for r in tr.at("update_actor")}
        if "minis" in want and upd:
            minis_seen += 1
            assert upd[0].mini_batches == [len(m) for m in want["minis"]], ctx_why
            empty = sum(all(all(c[i].startswith("pad_") for i in m) for c in want["chunks"]) for m in want["minis"])
            assert s.get("padding_only_mini_batches", {}).get("update_actor", 0) == empty, ctx_why
            all_padding += empty > 0
        old = {r.dp_rank: r for r in tr.at("old_log_prob")}
        if "micro" in want:
            micro_seen += 1
            base = ranks[0].extra["indices"]
            assert [[base.index(i) for i in m.indices] for m in old[0].micro_batches] == want["micro"], ctx_why
        else:
            uneven_micro += 1
            assert s["stage_errors"]["old_log_prob"]["message"] == want["micro_error"][1], ctx_why
    assert padded > 100 and minis_seen > 30 and micro_seen > 50 and uneven_micro > 20  # the cases were exercised
    assert all_padding >= 1  # incl. the targeted case: 1,504 padding rows, 188 of 522 actor mini-batches padding only


def test_replay_buffer_order_is_completion_order(oracle):
    errors = partial = 0
    for job, want in oracle["replay"]:
        B, n = job["prompts"], job["n"]
        order = [p * n + s for p, s in job["order"]]
        failed = sorted(set(range(B * n)) - set(order))
        ov = [f"data.train_batch_size={B}", f"{ARR}.rollout.n={n}", "trainer.n_gpus_per_node=1"]
        ov += [f"{ARR}.rollout.tensor_model_parallel_size=1", f"{ARR}.actor.ppo_mini_batch_size={B}"]
        cfg = load_config(overrides=ov + ["algorithm.adv_estimator=grpo"], profile="engine")
        tr = plan(cfg, None, completion_order=order or None, failed_sessions=failed)
        if "error" in want:  # every session failed: verl's RuntimeError, and nothing after the replay buffer
            errors += 1
            err = tr.summary["stage_errors"]["replay_buffer"]
            assert [err["exc_type"], err["message"]] == want["error"]
            assert tr.stage_names()[-1] == "replay_buffer"
            continue
        partial += bool(failed)
        got = [f"u{p}_{s}_0" for p, s in tr.stage("replay_buffer").extra["rows"]]
        assert got == want["keys"]
        assert tr.summary["samples"] == len(order) + tr.summary["padding_rows"]
    assert errors >= 10 and partial >= 30  # the failure cases were exercised


def test_agg_loss_with_padding_rows_equals_verl(oracle):
    nan = 0
    for job, want in oracle["agg"]:
        value = algo.agg_loss(
            torch.tensor(job["loss"], dtype=torch.float64),
            torch.tensor(job["mask"], dtype=torch.float64),
            job["mode"],
            profile="engine",
            dp_size=job["dp"],
            batch_num_tokens=job["tokens"],
            global_batch_size=job["global_batch_size"],
        )
        if math.isnan(want["value"]):
            nan += 1
            assert math.isnan(float(value)), job  # token-mean over a mini-batch of padding rows only: 0/0
        else:
            assert float(value) == pytest.approx(want["value"], rel=1e-12, abs=1e-12), job
    assert nan > 3


def test_transfer_queue_chunks_and_agent_loop_split(oracle):
    from tensordict import TensorDict

    for job, want in oracle["chunk"]:
        assert batch_meta_chunks(job["rows"], job["k"]) == want["sizes"], job
        if job["rows"]:  # the agent-loop split is TensorDict.chunk on the prompts
            td = TensorDict({"x": torch.zeros(job["rows"])}, batch_size=[job["rows"]])
            assert agent_loop_split(job["rows"], job["k"]) == [len(c) for c in td.chunk(job["k"])], job


def test_gen_batch_size_check_equals_verls_next_train_batch(oracle):
    """E47: labkit check's first step-1 error text == what verl's _next_train_batch raises, or both pass."""
    from labkit.validate.report import check

    fired = 0
    for job, want in oracle["fetch"]:
        ov = [f"data.train_batch_size={job['train_batch_size']}", "trainer.n_gpus_per_node=1"]
        ov += [f"{ARR}.rollout.tensor_model_parallel_size=1", f"{ARR}.actor.ppo_mini_batch_size=1"]
        if job["gen_batch_size"]:
            ov.append(f"data.gen_batch_size={job['gen_batch_size']}")
        findings = [
            f for f in check(load_config(overrides=ov, profile="engine"), fixes=False).findings if f.code == "E47"
        ]
        if want["error"] is None:
            assert findings == [], job
        else:
            fired += 1
            assert [[f.exc_type, f.message] for f in findings] == [want["error"]], job
    assert fired > 30


def test_v0_deprecation_notice_is_verls_text():
    """N7 is printed verbatim from verl/trainer/main_ppo.py (typo and missing space included)."""
    import verl

    from labkit.rules.catalogue import message

    src = (Path(verl.__file__).parent / "trainer" / "main_ppo.py").read_text()
    text = message("N7")
    head, tail = text.split("v0.9.0.")
    assert f'"{head}v0.9.0."' in src and f'"{tail}"' in src


# ---------------------------------------------------------------------------------------------- the checks
def _seed(*extra: str):
    return plan(load_config(overrides=SEED_EXAMPLE + list(extra), profile="engine"))


def test_seed_example_under_v1_is_the_default():
    s = _seed().summary
    assert s["loop"] == "v1" and s["agent_loop"]["prompts_per_worker"] == [8, 8, 8, 8, 8, 8, 8, 4]
    assert s["padding_rows"] == 0 and s["samples"] == 720 and s["ok"]
    m25 = _seed(f"{ARR}.actor.ppo_mini_batch_size=25")
    assert m25.summary["padding_rows"] == 180 and m25.stage("balance").per_rank_rows == 150
    assert m25.summary["stage_errors"]["old_log_prob"]["code"] == "E30"
    assert m25.summary["first_error"]["code"] == "E30" and "150 % 8" in " ".join(
        m25.summary["first_error"]["arithmetic"]
    )
    v0 = _seed(f"{ARR}.actor.ppo_mini_batch_size=25", "trainer.use_v1=false")
    assert v0.summary["loop"] == "v0" and v0.summary["stage_errors"]["update_actor"]["code"] == "E29"
    assert "old_log_prob" not in v0.summary["stage_errors"]
    critic = _seed("critic.enable=true", "critic.ppo_mini_batch_size=40", "critic.ppo_micro_batch_size_per_gpu=8")
    assert critic.summary["samples"] == 1440 and critic.summary["padding_rows"] == 720
    assert critic.stage("balance").per_rank_rows == 240


def test_v1_stage_order_and_no_repeat():
    from labkit.trace import V1_STAGES

    names = [st.name for st in _seed(f"{ARR}.actor.use_kl_loss=true").stages]
    assert names == [x for x in V1_STAGES if x not in ("values", "update_critic")]
    assert "repeat" not in names


def test_cli_says_which_loop(capsys):
    from labkit.cli import main

    assert main(["plan", *SEED_EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "Pipeline at a glance (engine profile, v1 loop)" in out and "8,8,8,8,8,8,8,4" in out
    assert main(["plan", *SEED_EXAMPLE, "trainer.use_v1=false"]) == 0
    assert "(engine profile, v0 loop)" in capsys.readouterr().out
    assert main(["check", *SEED_EXAMPLE, f"{ARR}.actor.ppo_mini_batch_size=25"]) == 1
    out = capsys.readouterr().out
    assert "verl rejects this config (engine profile, v1 loop):" in out and "(E30)" in out and "N6 Upsampled" in out
