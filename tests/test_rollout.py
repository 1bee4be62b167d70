"""labkit.rl.rollout / labkit.trainer.live_rollout: verl's rollout layout, repeat-interleave, real TP through a Ray worker group,
seeded sampling, EOS handling, and the planner's generate stage == the live trace for W in {1,2,4} x TP in {1,2},
both dispatch variants. One Ray session for the module; every group and Ray itself are checked gone afterwards."""

from __future__ import annotations

import os
import time

import pytest
import torch

from labkit.protocol.data_proto import DataProto
from labkit.rl import rollout
from labkit.runtime.ray_init import import_ray, ray_available
from labkit.runtime.ray_launcher import start_ray, stop_ray
from labkit.runtime.ray_reaper import session_pids
from labkit.runtime.worker_group import WorkerGroup, live_groups
from labkit.trainer.live_config import rollout_config
from labkit.trainer.live_rollout import LiveRollout, generate_stage_ok, returned

CONFIGS = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2)]  # (W, rollout TP); (1, 2) is E23, checked on the driver
B, N_SAMPLES, RESPONSE, PROMPT = 4, 2, 8, 24
GREEDY: dict = {}


def cfg_for(W: int, tp: int, B: int = B, n: int = N_SAMPLES):
    return rollout_config(
        [
            f"trainer.n_gpus_per_node={W}",
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
            f"data.train_batch_size={B}",
            f"actor_rollout_ref.rollout.n={n}",
            f"data.max_prompt_length={PROMPT}",
            f"data.max_response_length={RESPONSE}",
            "actor_rollout_ref.rollout.name=hf",  # labkit's TP-sharded HF engine (tests/test_vllm_*.py: vLLM)
        ]
    )


# ---- pure functions (no processes) --------------------------------------------------------------------------------
def test_response_mask_matches_verl_on_random_inputs():
    tf = pytest.importorskip("verl.utils.torch_functional", reason="verl 0.9.1 (test oracle) is not installed")
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        rows, width = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 17, (1,), generator=g))
        resp = torch.randint(0, 6, (rows, width), generator=g)
        eos = [1, 3] if trial % 3 == 0 else int(torch.randint(0, 6, (1,), generator=g))
        assert torch.equal(rollout.response_mask_from_eos(resp, eos), tf.get_response_mask(resp, eos_token=eos))


def test_postprocess_layout_eos_truncation_and_positions():
    pad, eos, P, R = 0, 7, 4, 5
    prompts = torch.tensor([[0, 0, 11, 12], [13, 14, 15, 16], [0, 17, 18, 19]])
    pmask = (torch.arange(P)[None] >= torch.tensor([2, 0, 1])[:, None]).long()
    ppos = (pmask.cumsum(1) - 1).clamp(min=0)
    gen = torch.tensor([[21, eos, 22, 23], [eos, 0, 0, 0], [24, 25, 26, 27]])  # HF stopped after 4 tokens
    out = rollout.postprocess(prompts, pmask, ppos, torch.cat([prompts, gen], 1), eos, pad, R)
    assert out["responses"].tolist() == [[21, eos, pad, pad, pad], [eos, pad, pad, pad, pad], [24, 25, 26, 27, pad]]
    assert out["response_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]]
    assert out["response_length"].tolist() == [2, 1, 4]
    assert torch.equal(out["attention_mask"], torch.cat([pmask, out["response_mask"]], 1))
    assert torch.equal(out["input_ids"], torch.cat([prompts, out["responses"]], 1))
    assert out["position_ids"].tolist()[0] == [0, 0, 0, 1, 2, 3, 4, 5, 6]
    assert out["position_ids"].tolist()[1] == list(range(9))
    longer = torch.cat([prompts, torch.full((3, 9), 30)], 1)  # more tokens than response_length: cut
    assert rollout.postprocess(prompts, pmask, ppos, longer, eos, pad, R)["response_length"].tolist() == [R] * 3


def test_generation_kwargs_follow_verl_sampling_keys():
    greedy = rollout.generation_kwargs(False, 1.0, -1, 1.0, 16, 0, 0)
    assert greedy["do_sample"] is False and greedy["temperature"] is None and greedy["top_k"] is None
    sample = rollout.generation_kwargs(True, 0.7, -1, 0.9, 16, 0, 0)
    assert (sample["temperature"], sample["top_k"], sample["top_p"], sample["max_new_tokens"]) == (0.7, 0, 0.9, 16)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        rollout.generation_kwargs(True, 0.0, -1, 1.0, 16, 0, 0)
    with pytest.raises(ValueError, match="response_length must be >= 1"):
        rollout.generation_kwargs(True, 1.0, -1, 1.0, 0, 0, 0)


def test_gen_batch_and_repeat_interleave_layout():
    tok = rollout.load_tokenizer()
    batch = rollout.make_gen_batch(5, seed=3, prompt_length=PROMPT, tokenizer=tok)
    again = rollout.make_gen_batch(5, seed=3, prompt_length=PROMPT, tokenizer=tok)
    assert list(batch.non_tensor_batch["uid"]) == list(again.non_tensor_batch["uid"])  # seeded
    assert len(set(batch.non_tensor_batch["uid"])) == 5
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    assert ids.shape == (5, PROMPT) and bool((mask[:, -1] == 1).all())  # left-padded
    assert bool((ids[mask == 0] == tok.pad_token_id).all())
    assert torch.equal(batch.batch["position_ids"], (mask.cumsum(1) - 1).clamp(min=0))
    for n in (1, 3, 4):
        rep = rollout.repeat_for_rollout(batch, n)
        assert len(rep) == 5 * n
        for i in range(5 * n):  # a,a,…,b,b,…
            assert torch.equal(rep.batch["input_ids"][i], ids[i // n])
            assert rep.non_tensor_batch["uid"][i] == batch.non_tensor_batch["uid"][i // n]
    with pytest.raises(ValueError, match="rollout.n must be a positive int"):
        rollout.repeat_for_rollout(batch, 0)
    with pytest.raises(ValueError, match="more than rollout.prompt_length 3"):
        rollout.make_gen_batch(5, seed=3, prompt_length=3, tokenizer=tok)


def test_bad_layouts_fail_on_the_driver_before_any_process():
    t0, n_live = time.monotonic(), len(live_groups())
    with pytest.raises(AssertionError, match=r"^rollout world_size: 1 is not divisible by infer_world_size: 2$"):
        LiveRollout(cfg_for(1, 2))
    with pytest.raises(ValueError, match=r"Total number of attention heads \(4\) must be divisible by tensor"):
        WorkerGroup(rollout.RolloutWorker, 3, init_kwargs={"tp": 3})
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        WorkerGroup(rollout.RolloutWorker, 1, init_kwargs={"prompt_length": 100, "response_length": 64})
    with pytest.raises(ValueError, match="shards by TP only"):
        WorkerGroup(rollout.RolloutWorker, 2, init_kwargs={"pp": 2})
    assert time.monotonic() - t0 < 5 and len(live_groups()) == n_live


# ---- live groups (real Ray actors, real gloo process groups) -------------------------------------------------------
@pytest.fixture(scope="module")
def ray_session():
    if not ray_available():
        pytest.skip("Ray is not installed here")
    owned = start_ray(num_cpus=4)
    ray = import_ray()
    session = ray._private.worker._global_node.get_session_dir_path() if owned else None
    yield
    if owned:
        stop_ray()
        assert not ray.is_initialized()
        deadline = time.monotonic() + 15
        while session_pids(session, exclude=(os.getpid(),)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert session_pids(session, exclude=(os.getpid(),)) == [], (
            "Ray processes of this session outlived ray.shutdown()"
        )


@pytest.fixture(scope="module", params=CONFIGS, ids=[f"W{w}-TP{t}" for w, t in CONFIGS])
def live(request, ray_session):
    W, tp = request.param
    lr = LiveRollout(cfg_for(W, tp), launcher="ray", collective_timeout_s=120)
    assert (
        lr.wg.launcher == "ray"
        and lr.wg.backend == "gloo"
        and lr.tp_groups == [list(range(g * tp, (g + 1) * tp)) for g in range(W // tp)]
    )
    yield lr
    report = lr.close()
    assert report["left_pids"] == [] and not any(p and _alive(p) for p in lr.wg.pids)
    assert all(r.get("pg_destroyed") is True for r in report["teardown"]), report["teardown"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def check_output(out: DataProto, batch: DataProto, n: int) -> None:
    """verl's keys and widths, rows in the driver's order, masks/positions consistent with the first EOS."""
    rep = rollout.repeat_for_rollout(batch, n)
    N, P, R = len(rep), rep.batch["input_ids"].shape[1], RESPONSE
    assert set(rollout.OUTPUT_KEYS) <= set(out.batch.keys()) and len(out) == N
    shapes = {
        "prompts": (N, P),
        "responses": (N, R),
        "response_mask": (N, R),
        "input_ids": (N, P + R),
        "attention_mask": (N, P + R),
        "position_ids": (N, P + R),
        "response_length": (N,),
    }
    assert {k: tuple(out.batch[k].shape) for k in shapes} == shapes
    assert torch.equal(out.batch["prompts"], rep.batch["input_ids"])  # collect order == dispatch order
    assert list(out.non_tensor_batch["uid"]) == list(rep.non_tensor_batch["uid"])
    eos, pad = batch.meta_info["eos_token_id"], batch.meta_info["pad_token_id"]
    mask = out.batch["response_mask"]
    assert torch.equal(mask, rollout.response_mask_from_eos(out.batch["responses"], eos))
    assert bool((out.batch["responses"][mask == 0] == pad).all())
    assert torch.equal(out.batch["response_length"], mask.sum(1)) and int(mask.sum(1).min()) >= 1
    assert torch.equal(out.batch["attention_mask"], torch.cat([rep.batch["attention_mask"], mask], 1))
    pos = out.batch["position_ids"]
    assert torch.equal(pos[:, P:], pos[:, P - 1 : P] + torch.arange(1, R + 1))


@pytest.mark.parametrize("dispatch", ["mesh", "all_gather"])
def test_prediction_equals_observation(live, dispatch):
    W, tp = live.sizes.geo.world_size, live.sizes.geo.rollout_tp
    batch = live.batch(seed=11)
    pred = live.predict(batch, dispatch)
    out, trace = live.run(batch, dispatch=dispatch, seed=5)
    check_output(out, batch, N_SAMPLES)
    assert generate_stage_ok(pred, trace, out) == []
    assert pred.summary["rollout_mesh"]["groups"] == live.tp_groups
    recs = trace.at("generate")
    assert [r.rank for r in recs] == list(range(W)) and trace.stage("generate").global_rows == B * N_SAMPLES
    assert [r.extra["recv_rows"] for r in recs] == [B * N_SAMPLES // (W // tp if dispatch == "mesh" else W)] * W
    assert [r.rows for r in recs] == [B * N_SAMPLES * tp // W] * W
    collected = [r.extra["collected"] for r in recs]
    assert collected == ([r.tp_rank == 0 for r in recs] if dispatch == "mesh" else [True] * W)
    assert sum(r.rows for r in returned(trace).at("generate:returned")) == B * N_SAMPLES
    # TP is real: two all-reduces per decoder layer per forward step (+ one logits broadcast), none at TP=1
    m, layers = out.meta_info["metrics"], live.wg.model_info()["config"]["num_hidden_layers"]
    assert len(m["rank"]) == (W // tp if dispatch == "mesh" else W)
    for all_reduce, broadcast, steps in zip(m["tp_all_reduce"], m["tp_broadcast"], m["forward_steps"]):
        assert 1 <= steps <= RESPONSE
        assert (all_reduce, broadcast) == ((2 * layers * steps, steps) if tp > 1 else (0, 0))
    # a deliberately wrong prediction is caught (the comparison can fail)
    pred.at("generate")[-1].rows += 1
    assert any("rows predicted" in m for m in generate_stage_ok(pred, trace, out))


def test_greedy_tokens_equal_for_every_W_and_TP(live):
    """Greedy decoding: TP=2 (sharded heads/MLP, all-reduce) gives the same tokens as TP=1 and as the whole model in
    one process, whatever W (every config of the module is compared with the same in-process reference)."""
    batch = live.batch(seed=11)
    out, _ = live.run(batch, dispatch="mesh", do_sample=False)
    check_output(out, batch, N_SAMPLES)
    if "whole" not in GREEDY:  # the whole model in this process: TP=1, one replica, no worker group
        GREEDY["whole"] = rollout.reference_generate(batch, N_SAMPLES, do_sample=False, response_length=RESPONSE)
    whole = GREEDY["whole"]
    check_output(whole, batch, N_SAMPLES)
    assert torch.equal(out.batch["responses"], whole.batch["responses"]), (
        f"greedy tokens of W={live.sizes.geo.world_size}, TP={live.sizes.geo.rollout_tp} differ from the whole model's"
    )
    assert torch.equal(out.batch["responses"][0::2], out.batch["responses"][1::2])  # greedy: n copies identical


def test_seeded_sampling_is_reproducible(live):
    batch = live.batch(seed=11)
    a, _ = live.run(batch, dispatch="mesh", seed=3)
    b, _ = live.run(batch, dispatch="mesh", seed=3)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    if (
        live.sizes.geo.world_size // live.sizes.geo.rollout_tp == 1
    ):  # one replica: its sampling stream is the in-process reference's
        ref = rollout.reference_generate(batch, N_SAMPLES, seed=3, response_length=RESPONSE)
        assert torch.equal(a.batch["responses"], ref.batch["responses"])
    hot3, _ = live.run(batch, dispatch="mesh", seed=3, temperature=3.0)  # flat enough that seeds must matter
    hot4, _ = live.run(batch, dispatch="mesh", seed=4, temperature=3.0)
    assert not torch.equal(hot3.batch["responses"], hot4.batch["responses"])


def test_eos_stops_each_row_at_its_first_eos(live):
    """Declare a token the greedy run produced as EOS: each row must stop right after its first occurrence."""
    batch = live.batch(seed=11)
    ref, _ = live.run(batch, dispatch="mesh", do_sample=False)
    lengths = ref.batch["response_length"]
    row = int(lengths.argmax())
    fake_eos = int(ref.batch["responses"][row, 0])
    batch.meta_info["eos_token_id"] = fake_eos
    out, _ = live.run(batch, dispatch="mesh", do_sample=False)
    check_output(out, batch, N_SAMPLES)
    assert int(out.batch["response_length"][row]) == 1
    for i in range(len(ref)):
        toks, L = ref.batch["responses"][i].tolist(), int(lengths[i])
        hits = [k for k in range(L) if toks[k] == fake_eos]
        if hits:
            k = hits[0]
            assert int(out.batch["response_length"][i]) == k + 1
            assert out.batch["responses"][i, : k + 1].tolist() == toks[: k + 1]
        else:  # the row never produced it: same tokens up to the real EOS (or the length cap)
            assert out.batch["responses"][i, : L - 1].tolist() == toks[: L - 1]


def test_uneven_batch_is_verl_e26_and_the_group_survives(live):
    W, tp = live.sizes.geo.world_size, live.sizes.geo.rollout_tp
    small = rollout.make_gen_batch(3, 0, PROMPT, live.tokenizer)
    for dispatch, chunks in (("mesh", W // tp), ("all_gather", W)):
        if chunks == 1:
            out = rollout.generate(live.wg, small, 1, dispatch=dispatch, response_length=2)
            assert len(out) == 3
            continue
        with pytest.raises(AssertionError) as err:
            rollout.generate(live.wg, small, 1, dispatch=dispatch, response_length=2)
        assert str(err.value) == f"only support equal chunk. Got size of DataProto 3 and chunk {chunks}."
    assert len(rollout.generate(live.wg, small, 4, response_length=2)) == 12  # still usable
