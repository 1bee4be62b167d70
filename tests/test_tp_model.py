"""Rollout TP on real processes: 2 gloo ranks shard a random-init tiny Qwen2 and must match the unsharded model.

One spawn of 2 ranks runs every TP=2 check and sends numpy/python results back (never torch tensors: a torch tensor through an
mp queue can hang the parent); the TP=1 reference runs in the test process from the same saved weights.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import time
import traceback

import numpy as np
import pytest
import torch

from labkit.model.tp_communications import tp_collective_counts
from labkit.model.tp_parallel import check_tp_split, shard_model_for_tp, sharded_param_names, tp_generate

LOGIT_ATOL = 1e-5  # fp32; measured max |diff| is ~1e-7 (a row-parallel sum is split in two, then all-reduced)
GRAD_ATOL = 1e-5
N_PROMPTS, NEW_TOKENS = 8, 16
CFG = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)
WATCH = [
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.bias",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.1.mlp.up_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
]
REPLICATED = ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "lm_head.weight"]
GREEDY = dict(
    max_new_tokens=NEW_TOKENS,
    min_new_tokens=NEW_TOKENS,
    do_sample=False,
    pad_token_id=0,
    temperature=None,
    top_k=None,
    top_p=None,
)
SAMPLE = dict(
    max_new_tokens=NEW_TOKENS,
    min_new_tokens=NEW_TOKENS,
    do_sample=True,
    pad_token_id=0,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
)


def _build(cfg: dict, state_path: str | None = None):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**cfg, attn_implementation="sdpa"))
    if state_path is not None:
        model.load_state_dict(torch.load(state_path))
    return model.eval()


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    lens = rng.integers(3, 13, size=N_PROMPTS)
    ids = np.zeros((N_PROMPTS, int(lens.max())), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lens):
        ids[i, -n:] = rng.integers(1, CFG["vocab_size"], size=n)
        mask[i, -n:] = 1
    pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    return ids, mask, pos


def _forward_and_grads(model, ids, mask, pos):
    """Logits (left-padded batch, explicit position_ids) and grads of a masked next-token log-likelihood."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (-(logp * mask[:, 1:]).sum()).backward()
    grads = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters() if n in WATCH + REPLICATED}
    return logits.detach().numpy().copy(), grads


def _rank_main(rank: int, world: int, port: int, payload: dict, out_q) -> None:
    """One TP rank (module level so spawn can import it); puts (rank, results) with numpy/python values only."""
    res: dict = {"t_entry": time.time()}
    try:
        import torch.distributed as dist
        import transformers.models.qwen2.modeling_qwen2  # noqa: F401  (import before the barrier: both ranks at once)

        torch.set_num_threads(1)
        res["t_import"] = time.time()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        group = dist.new_group(list(range(world)))
        res["t_init"] = time.time()
        # (d) a bad split raises on rank 0 alone, before any collective: rank 1 does not call it, so a collective would hang.
        if rank == 0:
            bad = _build({**CFG, "num_key_value_heads": 1})
            try:
                shard_model_for_tp(bad, group)
                res["bad_split"] = None
            except ValueError as e:
                res["bad_split"] = str(e)
            res["bad_untouched"] = type(bad.model.layers[0].self_attn.q_proj) is torch.nn.Linear
        dist.barrier(group=group)

        res["t_bad"] = time.time()
        model = _build(CFG, payload["state_path"])
        res["t_build"] = time.time()
        t0 = time.perf_counter()
        shard_model_for_tp(model, group)
        res["shard_s"] = time.perf_counter() - t0
        params = dict(model.named_parameters())
        sharded = set(sharded_param_names(model))
        res["n_sharded"] = sum(p.numel() for n, p in params.items() if n in sharded)
        res["n_replicated"] = sum(p.numel() for n, p in params.items() if n not in sharded)
        res["own_storage"] = all(p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in params.values())
        res["watch"] = {n: params[n].detach().numpy().copy() for n in WATCH}
        res["attn_heads"] = (
            model.model.layers[0].self_attn.num_heads,
            model.model.layers[0].self_attn.num_key_value_heads,
        )

        ids, mask, pos = (torch.from_numpy(a) for a in payload["inputs"])
        t0 = time.perf_counter()
        res["logits"], res["grads"] = _forward_and_grads(model, ids, mask, pos)
        res["fwd_bwd_s"] = time.perf_counter() - t0
        c0 = tp_collective_counts()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        c1 = tp_collective_counts()
        t0 = time.perf_counter()
        res["greedy"] = tp_generate(model, ids, mask, GREEDY, seed=0).numpy().copy()
        res["greedy_s"] = time.perf_counter() - t0
        c2 = tp_collective_counts()
        res["counts_fwd"] = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1}
        res["counts_gen"] = {k: c2.get(k, 0) - c1.get(k, 0) for k in c2}
        res["sample_7a"] = tp_generate(model, ids, mask, SAMPLE, seed=7).numpy().copy()
        res["sample_7b"] = tp_generate(model, ids, mask, SAMPLE, seed=7).numpy().copy()
        res["sample_8"] = tp_generate(model, ids, mask, SAMPLE, seed=8).numpy().copy()
        # Different prompts on the two ranks: both ranks must raise (no hang, no silent divergence).
        try:
            tp_generate(model, (ids + rank) % CFG["vocab_size"], mask, GREEDY, seed=0)
            res["mismatch"] = None
        except RuntimeError as e:
            res["mismatch"] = str(e)

        res["t_gen"] = time.time()
        if payload.get("shipped"):
            from transformers.utils import logging as hf_logging

            from labkit.model.tiny_model import load_tiny_model

            hf_logging.disable_progress_bar()  # tqdm's mp lock would outlive os._exit below as a "leaked semaphore"
            tiny = shard_model_for_tp(load_tiny_model(payload["shipped_dir"]), group)
            s_ids, s_mask = (torch.from_numpy(a) for a in payload["shipped"])
            res["shipped"] = (
                tp_generate(tiny, s_ids, s_mask, {**GREEDY, "pad_token_id": payload["shipped_pad"]}).numpy().copy()
            )
        dist.barrier(group=group)
        dist.destroy_process_group()
        res["t_end"] = time.time()
    except BaseException:  # report, never leave the parent waiting for a timeout
        res = {"error": traceback.format_exc()}
    out_q.put((rank, res))
    out_q.close()
    out_q.join_thread()  # the results are flushed to the pipe
    os._exit(
        0
    )  # skip interpreter teardown of torch/transformers (seconds on a loaded 2-core box); nothing is left open


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shipped_inputs():
    """Left-padded task prompts for the shipped tiny model, or None when it is not in data/ yet."""
    from labkit.model import tiny_model

    folder = tiny_model.TINY_MODEL_DIR
    if not (folder / "model.safetensors").exists():
        return None
    tok = tiny_model.load_tiny_tokenizer(folder)
    ids, mask = tiny_model.left_pad(tiny_model.make_prompts(6, seed=3, tokenizer=tok)["input_ids"], tok.pad_token_id)
    return ids.numpy(), mask.numpy(), tok.pad_token_id, str(folder)


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """Run the 2-rank job once; returns (rank results, TP=1 reference model, inputs, shipped inputs, wall seconds)."""
    import torch.multiprocessing as mp

    state_path = str(tmp_path_factory.mktemp("tp") / "state.pt")
    ref = _build(CFG)
    torch.save(ref.state_dict(), state_path)
    inputs = _inputs()
    shipped = _shipped_inputs()
    payload = {"state_path": state_path, "inputs": inputs}
    if shipped is not None:
        payload.update(shipped=shipped[:2], shipped_pad=shipped[2], shipped_dir=shipped[3])
    ctx = mp.get_context("spawn")
    out_q = ctx.Queue()
    port = _free_port()
    t0 = time.perf_counter()
    t_spawn = time.time()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, payload, out_q), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    results: dict = {}
    try:
        for _ in procs:
            rank, res = out_q.get(timeout=180)  # a hang guard; imports alone took 40 s on a loaded box
            results[rank] = res
    except queue_mod.Empty:
        pass
    finally:
        t_recv = time.time()
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    wall = time.perf_counter() - t0
    for r, res in sorted(results.items()):
        marks = {k: round(v - t_spawn, 2) for k, v in res.items() if k.startswith("t_")}
        print(f"rank {r} timeline (s after spawn): {marks}")
    print(f"received {t_recv - t_spawn:.2f}s, joined {time.time() - t_spawn:.2f}s")
    assert set(results) == {0, 1}, f"ranks timed out; got results from {sorted(results)}"
    for r, res in results.items():
        assert "error" not in res, f"rank {r} failed:\n{res['error']}"
    return results, ref, inputs, shipped, wall


def test_logits_tp2_equal_tp1(tp_run):
    """(a) Left-padded batch with attention mask and position ids: TP=2 logits == TP=1 logits within 1e-5 (fp32)."""
    results, ref, inputs, _, wall = tp_run
    ids, mask, pos = (torch.from_numpy(a) for a in inputs)
    ref_logits, _ = _forward_and_grads(ref, ids, mask, pos)
    for r in (0, 1):
        diff = np.abs(results[r]["logits"] - ref_logits)[inputs[1].astype(bool)].max()
        print(
            f"rank {r}: max |logit diff| = {diff:.2e} (scale {np.abs(ref_logits).max():.2f}); 2-rank job wall {wall:.1f}s"
        )
        assert diff <= LOGIT_ATOL
    np.testing.assert_array_equal(results[0]["logits"], results[1]["logits"])  # one output per TP group


def test_grads_tp2_are_slices_of_tp1(tp_run):
    """Autograd through the TP collectives: each rank's grads are its slice of TP=1's; replicated grads are whole."""
    results, ref, inputs, _, _ = tp_run
    _, ref_grads = _forward_and_grads(ref, *(torch.from_numpy(a) for a in inputs))
    for name in WATCH:
        full = ref_grads[name]
        axis = 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0
        np.testing.assert_allclose(
            np.concatenate([results[r]["grads"][name] for r in (0, 1)], axis=axis), full, atol=GRAD_ATOL
        )
    for name in REPLICATED:
        for r in (0, 1):
            np.testing.assert_allclose(results[r]["grads"][name], ref_grads[name], atol=GRAD_ATOL)


def test_greedy_generate_tp2_equals_tp1(tp_run):
    """(b) Greedy decoding, 8 prompts x 16 new tokens with the KV cache: TP=2 gives exactly TP=1's tokens."""
    results, ref, inputs, _, _ = tp_run
    ids, mask, _ = (torch.from_numpy(a) for a in inputs)
    out = ref.generate(input_ids=ids, attention_mask=mask, **GREEDY, return_dict_in_generate=True, output_scores=True)
    gaps = [float((s.topk(2).values[:, 0] - s.topk(2).values[:, 1]).min()) for s in out.scores]
    print(
        f"smallest top-1/top-2 logit gap on the greedy path: {min(gaps):.2e}; TP=2 greedy {results[0]['greedy_s']:.2f}s"
    )
    assert out.sequences.shape == (N_PROMPTS, ids.shape[1] + NEW_TOKENS)
    for r in (0, 1):
        np.testing.assert_array_equal(results[r]["greedy"], out.sequences.numpy())


def test_seeded_sampling_reproducible_and_identical_across_tp_ranks(tp_run):
    """(c) do_sample with a seed: both TP ranks return the same tokens, the same seed repeats, another seed differs."""
    results, _, inputs, _, _ = tp_run
    for key in ("sample_7a", "sample_8"):
        np.testing.assert_array_equal(results[0][key], results[1][key])
    np.testing.assert_array_equal(results[0]["sample_7a"], results[0]["sample_7b"])
    width = inputs[0].shape[1]
    assert not np.array_equal(results[0]["sample_7a"][:, width:], results[0]["sample_8"][:, width:])
    assert not np.array_equal(results[0]["sample_7a"], results[0]["greedy"])


def test_bad_split_raises_before_any_collective(tp_run):
    """(d) Heads not divisible by t: a clear ValueError naming both head counts, raised on one rank without a hang."""
    from transformers import Qwen2Config

    with pytest.raises(ValueError, match=r"attention heads \(4\) must be divisible by tensor parallel size \(3\)"):
        check_tp_split(Qwen2Config(**CFG), 3)
    with pytest.raises(ValueError, match=r"key-value heads \(2\) must be divisible by tensor parallel size \(4\)"):
        check_tp_split(Qwen2Config(**CFG), 4)  # 4 attention heads split over 4: the KV heads are the cause
    msg = tp_run[0][0]["bad_split"]  # rank 0 alone sharded a kv_heads=1 model over TP=2, then reached the barrier
    assert msg is not None and "key-value heads (1)" in msg and "num_key_value_heads=1" in msg
    assert tp_run[0][0]["bad_untouched"], "a refused split must leave the model unsharded"
    with pytest.raises(ValueError, match=r"intermediate_size \(256\)"):
        check_tp_split(Qwen2Config(**{**CFG, "num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 96}), 3)


def test_each_rank_holds_only_its_slice(tp_run):
    """(e) Sharded layers hold 1/t of their parameters per rank, as fresh tensors that are exact slices of TP=1's."""
    results, ref, _, _, _ = tp_run
    full = dict(ref.named_parameters())
    n_layers = CFG["num_hidden_layers"]
    per_layer_sharded = sum(p.numel() for n, p in full.items() if n.startswith("model.layers.0.") and "proj" in n)
    total = sum(p.numel() for p in full.values())
    for r in (0, 1):
        res = results[r]
        assert res["n_sharded"] * 2 == per_layer_sharded * n_layers
        assert res["n_replicated"] == total - per_layer_sharded * n_layers
        assert res["own_storage"], "a parameter is a view into a larger (unsharded) tensor"
        assert res["attn_heads"] == (2, 1)
        for name in WATCH:
            w, whole = res["watch"][name], full[name].detach().numpy()
            axis = 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0
            assert w.shape[axis] * 2 == whole.shape[axis]
            np.testing.assert_array_equal(w, np.split(whole, 2, axis=axis)[r])
    print(f"per rank: {results[0]['n_sharded'] + results[0]['n_replicated']:,} of {total:,} params")


def test_collective_counts(tp_run):
    """Two all-reduces per decoder layer per forward; generate adds one logits broadcast per step and two checks."""
    n_layers = CFG["num_hidden_layers"]
    for r in (0, 1):
        assert tp_run[0][r]["counts_fwd"] == {"all_reduce": 2 * n_layers}
        assert tp_run[0][r]["counts_gen"] == {
            "all_reduce": 2 * n_layers * NEW_TOKENS,
            "broadcast": NEW_TOKENS,
            "all_gather": 2,
        }


def test_tp_groups_refuse_different_prompts(tp_run):
    """Every TP rank must get the same prompts; otherwise both ranks raise (instead of hanging or diverging)."""
    for r in (0, 1):
        assert tp_run[0][r]["mismatch"] is not None and "different input_ids" in tp_run[0][r]["mismatch"]


def test_tp1_without_process_group_is_the_plain_model():
    """TP size 1 (no torch.distributed): the 'sharded' model is the whole model, bitwise, and issues no collective."""
    import copy

    ref = _build(CFG)
    model = shard_model_for_tp(copy.deepcopy(ref), None)
    assert model.labkit_tp.tp_size == 1 and model.labkit_tp.heads_per_rank == CFG["num_attention_heads"]
    ids, mask, pos = (torch.from_numpy(a) for a in _inputs(1))
    before = tp_collective_counts()
    with torch.no_grad():
        a = ref(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        b = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    assert torch.equal(a, b)
    assert torch.equal(tp_generate(model, ids, mask, SAMPLE, seed=3), tp_generate(ref, ids, mask, SAMPLE, seed=3))
    assert tp_collective_counts() == before
    with pytest.raises(ValueError, match="already sharded"):
        shard_model_for_tp(model, None)


def test_shipped_tiny_model_tp2_greedy_equals_tp1(tp_run):
    """The shipped tiny model (data/tiny-qwen2) under TP=2 generates exactly what it generates unsharded."""
    results, _, _, shipped, _ = tp_run
    if shipped is None:
        pytest.skip("data/tiny-qwen2/model.safetensors is not there yet (scripts/train_tiny_model.py writes it)")
    from labkit.model.tiny_model import load_tiny_model

    ids, mask, pad = torch.from_numpy(shipped[0]), torch.from_numpy(shipped[1]), shipped[2]
    ref = load_tiny_model(shipped[3]).generate(input_ids=ids, attention_mask=mask, **{**GREEDY, "pad_token_id": pad})
    for r in (0, 1):
        np.testing.assert_array_equal(results[r]["shipped"], ref.numpy())
