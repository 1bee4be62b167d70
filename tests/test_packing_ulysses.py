"""Padding removal and Ulysses SP: labkit.model.packing / labkit.model.ulysses / labkit.model.logprob against the padded forward,
against SP=1, and against verl 0.9.1's helpers.

Tolerances (fp32, random-init tiny Qwen2, 4 heads / 2 kv heads): log-probs and entropy 1e-5 absolute (measured
~5e-7: packing changes only the order of sdpa's reductions); gradients 1e-5 absolute (measured ~1e-7 or less).
SP runs once, in 4 real gloo processes (tests/_ulysses_ranks.py): mesh (dp=2, sp=2) and (dp=1, sp=4).
"""

from __future__ import annotations

import time

import _ulysses_ranks as R
import numpy as np
import pytest
import torch

from labkit.model.logprob import E12_SP_NEEDS_RMPAD, forward_micro_batch
from labkit.model.packing import (
    compute_position_id_with_mask,
    index_first_axis,
    pack_micro_batch,
    pad_input,
    unpad_input,
)
from labkit.model.ulysses import (
    apply_ulysses_patch,
    check_ulysses_heads,
    kv_head_repeats,
    slice_input_tensor,
    ulysses_pad,
    ulysses_pad_and_slice_inputs,
)
from labkit.model.ulysses_demo import spawn_ranks

ATOL = 1e-5
GRAD_ATOL = 1e-5
RANK_TIMEOUT_S = 240.0


def _masked_max_diff(a, b, mask) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b))[np.asarray(mask).astype(bool)].max())


# ---- fixtures -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return R.build_model()


@pytest.fixture(scope="module")
def batches():
    return {name: R.make_batch(name) for name in R.BATCHES}


@pytest.fixture(scope="module")
def reference(model, batches):
    """SP=1 in this process: rmpad and padded log-probs / entropy (no_grad), and rmpad grads of Σ w·mask·log p."""
    out = {}
    for name, batch in batches.items():
        micro = R.to_micro(batch)
        with torch.no_grad():
            for rmpad in (False, True):
                for chunked in (False, True):
                    lp, ent = forward_micro_batch(
                        model,
                        micro,
                        use_remove_padding=rmpad,
                        temperature=R.TEMPERATURE,
                        calculate_entropy=True,
                        chunked=chunked,
                    )
                    out[name, rmpad, chunked] = (lp.numpy(), ent.numpy())
        model.train()
        _, grads = R.grads_of_weighted_logprob(model, batch)
        _, grads_padded = R.grads_of_weighted_logprob(model, batch, use_remove_padding=False)
        model.eval()
        out[name, "grads"] = {k: v.numpy() for k, v in grads.items()}
        out[name, "grads_padded"] = {k: v.numpy() for k, v in grads_padded.items()}
    return out


@pytest.fixture(scope="module")
def sp_run(model, tmp_path_factory):
    """One 4-rank gloo job (spawn); returns {rank: results} and the wall time."""
    state_path = str(tmp_path_factory.mktemp("uly") / "state.pt")
    torch.save(model.state_dict(), state_path)
    payload = {"state_path": state_path, "batches": {name: R.make_batch(name) for name in R.BATCHES}}
    t0 = time.perf_counter()
    results = spawn_ranks(R.rank_main, 4, payload, RANK_TIMEOUT_S)  # raises with each failing rank's traceback
    return results, time.perf_counter() - t0


# ---- (a) rmpad == padded, (g) chunked == naive, (f) the use_cache pitfall -------------------------------------------
def test_rmpad_equals_padded(reference, batches):
    for name, batch in batches.items():
        rmask = batch["response_mask"]
        lp_pad, ent_pad = reference[name, False, False]
        for rmpad, chunked in [(True, False), (True, True), (False, True)]:
            lp, ent = reference[name, rmpad, chunked]
            assert _masked_max_diff(lp, lp_pad, rmask) < ATOL, (name, rmpad, chunked)
            assert _masked_max_diff(ent, ent_pad, rmask) < ATOL, (name, rmpad, chunked)
        lp_rm, _ = reference[name, True, False]
        logits_mask = batch["attention_mask"][:, -R.RESPONSE_WIDTH - 1 : -1]  # slice j = logits of position P+j-1
        assert np.all(lp_rm[logits_mask == 0] == 0.0), "pad_input puts zeros where no real token was"
        assert np.all(lp_rm[logits_mask == 1] < 0.0)
        assert np.all(lp_pad[rmask == 1] < 0) and np.isfinite(lp_pad).all()


def test_rmpad_gradients_equal_padded(reference):
    for name in R.BATCHES:
        ref, rm = reference[name, "grads_padded"], reference[name, "grads"]
        assert max(float(np.abs(rm[p] - g).max()) for p, g in ref.items()) < GRAD_ATOL, name
        assert max(float(np.abs(g).max()) for g in ref.values()) > 1e-2  # not vacuous: the gradient is not ~0


def test_temperature_and_grad_mode_agree(model, batches):
    """T scales the logits (T=1 differs from T=0.7), and the with-grad forward equals the no_grad one."""
    micro = R.to_micro(batches["odd"])
    rmask = batches["odd"]["response_mask"]
    with torch.no_grad():
        lp_t, _ = forward_micro_batch(model, micro, use_remove_padding=True, temperature=R.TEMPERATURE)
        lp_1, _ = forward_micro_batch(model, micro, use_remove_padding=True, temperature=1.0)
    lp_g, _ = forward_micro_batch(model, micro, use_remove_padding=True, temperature=R.TEMPERATURE)
    assert lp_g.requires_grad and not lp_t.requires_grad
    assert _masked_max_diff(lp_g.detach(), lp_t, rmask) == 0.0
    assert _masked_max_diff(lp_1, lp_t, rmask) > 1e-3


def test_packed_needs_use_cache_false(model, batches):
    """Negative control: the same packed row with the default use_cache (config.use_cache=True here) silently lets
    sequences attend to each other; forward_micro_batch passes use_cache=False, so its numbers match the padded path."""
    assert model.config.use_cache is True
    b = batches["even"]
    packed = pack_micro_batch(*(torch.from_numpy(b[k]) for k in ("input_ids", "attention_mask", "position_ids")))
    with torch.no_grad():
        good = model(
            input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None, use_cache=False
        ).logits
        bad = model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None).logits
    first = int(packed.cu_seqlens[1])  # the first sequence sees nothing before it: identical either way
    assert torch.allclose(good[:, :first], bad[:, :first], atol=1e-5)
    assert (good - bad).abs().max().item() > 1e-2


def test_ulysses_attention_without_sp_is_sdpa(model, batches, reference):
    """The patched model outside an SP group equals sdpa on both paths: the padded path proves the mask interface
    entry is registered (a 2-D padding mask must reach the attention). Negative control: the same attention
    registered WITHOUT an AttentionMaskInterface entry gets mask=None and the padded path goes wrong."""
    import copy

    from transformers import AttentionInterface

    from labkit.model.ulysses import ulysses_attention_forward

    patched = apply_ulysses_patch(copy.deepcopy(model), 2)
    b = batches["odd"]
    with torch.no_grad():
        for rmpad in (False, True):
            lp, _ = forward_micro_batch(patched, R.to_micro(b), use_remove_padding=rmpad, temperature=R.TEMPERATURE)
            assert _masked_max_diff(lp, reference["odd", rmpad, True][0], b["response_mask"]) < ATOL, rmpad
        AttentionInterface.register("labkit_probe_no_mask", ulysses_attention_forward)
        patched.set_attn_implementation("labkit_probe_no_mask")
        lp, _ = forward_micro_batch(patched, R.to_micro(b), use_remove_padding=False, temperature=R.TEMPERATURE)
    assert _masked_max_diff(lp, reference["odd", False, True][0], b["response_mask"]) > 1e-3


def test_chunked_logprob_small_chunks_and_grads(model, batches):
    """(g) chunked == naive with tiny chunks (many chunk boundaries), for values and parameter gradients."""
    b = batches["odd"]
    rmask = torch.from_numpy(b["response_mask"])
    out = {}
    model.train()
    for chunked, size in [(False, 0), (True, 5)]:
        model.zero_grad(set_to_none=True)
        kw = dict(chunk_size=size) if chunked else {}
        lp, ent = forward_micro_batch(
            model,
            R.to_micro(b),
            use_remove_padding=True,
            temperature=R.TEMPERATURE,
            calculate_entropy=True,
            chunked=chunked,
            **kw,
        )
        ((lp + 0.1 * ent) * rmask).sum().backward()
        out[chunked] = (lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    model.eval()
    assert (out[True][0] - out[False][0])[rmask.bool()].abs().max() < ATOL
    assert (out[True][1] - out[False][1])[rmask.bool()].abs().max() < ATOL
    for name, g in out[False][2].items():
        assert torch.allclose(out[True][2][name], g, atol=GRAD_ATOL, rtol=0), name


# ---- (b), (c): Ulysses SP on real processes -----------------------------------------------------------------------
def test_sp_logprobs_equal_sp1(sp_run, reference, batches):
    results, _ = sp_run
    for rank, res in results.items():
        name = ["even", "odd"][res["dp_rank"]]
        rmask = batches[name]["response_mask"]
        lp_ref, ent_ref = reference[name, True, True]
        assert _masked_max_diff(res["sp2/lp"], lp_ref, rmask) < ATOL, (rank, name)
        assert _masked_max_diff(res["sp2/ent"], ent_ref, rmask) < ATOL, (rank, name)
        assert _masked_max_diff(res["sp2/lp_naive"], reference[name, True, False][0], rmask) < ATOL
        assert _masked_max_diff(res["sp2/lp_grad"], lp_ref, rmask) < ATOL
        rmask = batches["odd"]["response_mask"]  # sp=4: nnz 39 -> Ulysses pad 1; kv heads 2 repeated to 4
        lp_ref, ent_ref = reference["odd", True, True]
        assert _masked_max_diff(res["sp4/lp"], lp_ref, rmask) < ATOL, rank
        assert _masked_max_diff(res["sp4/ent"], ent_ref, rmask) < ATOL, rank
        assert _masked_max_diff(res["sp4/lp_naive"], reference["odd", True, False][0], rmask) < ATOL
    worst = max(
        _masked_max_diff(res[f"{t}/lp"], reference[n, True, True][0], batches[n]["response_mask"])
        for res in results.values()
        for t, n in [("sp2", ["even", "odd"][res["dp_rank"]]), ("sp4", "odd")]
    )
    print(f"\nSP log-prob max |diff| vs SP=1: {worst:.2e}")
    nnz = {name: int(b["attention_mask"].sum()) for name, b in batches.items()}
    assert nnz["even"] % 4 == 0 and nnz["odd"] % 2 == 1, nnz  # both divisibility cases really ran
    assert kv_head_repeats(R.CFG["num_key_value_heads"], 4) == 2


def test_sp_gradients_equal_sp1(sp_run, reference):
    """Each SP rank back-propagates the same loss through the gathered log-probs; Gather's ×sp grad scaler plus an
    average of parameter grads over the SP ranks (all_reduce SUM / sp, what FSDP's reduce-scatter-avg does within
    one DP group) gives exactly the SP=1 gradient. A single rank's own gradient does not."""
    results, _ = sp_run
    for rank, res in results.items():
        for tag, name in [("sp2", ["even", "odd"][res["dp_rank"]]), ("sp4", "odd")]:
            ref = reference[name, "grads"]
            assert set(res[f"{tag}/grads"]) == set(ref)
            for pname, g in res[f"{tag}/grads"].items():
                assert np.abs(g - ref[pname]).max() < GRAD_ATOL, (rank, tag, pname)
            worst = max(float(np.abs(g - ref[p]).max()) for p, g in res[f"{tag}/grads"].items())
            print(f"rank {rank} {tag}: grad max |diff| vs SP=1 {worst:.2e}")
            local = res[f"{tag}/local_embed_grad"]
            assert np.abs(local - ref["model.embed_tokens.weight"]).max() > 1e-4, (rank, tag)


def test_sp_collectives(sp_run):
    """All-to-all layout and round trip, Gather's grad scaler, and the collectives one forward issues: 4 all-to-alls
    (q, k, v, out) and 1 position all-gather per layer, plus 2 output gathers (log-probs, entropy)."""
    results, wall = sp_run
    layers = R.CFG["num_hidden_layers"]
    for rank, res in results.items():
        for tag, sp in [("sp2", 2), ("sp4", 4)]:
            assert res[f"{tag}/a2a_ok"] and res[f"{tag}/a2a_roundtrip_ok"] and res[f"{tag}/a2a_grad_ok"], (rank, tag)
            expect = np.repeat(np.arange(sp, dtype=np.float32), 3)[:-2]
            np.testing.assert_array_equal(res[f"{tag}/gathered"], expect)
            r = res["sp_rank"] if tag == "sp2" else rank  # (dp=1, sp=4): the SP rank is the global rank
            grad = np.full(3, float(sp), dtype=np.float32)
            if r == sp - 1:
                grad[1:] = 0.0  # the stripped padding gets no gradient
            np.testing.assert_array_equal(res[f"{tag}/gather_grad"], grad)
            counts = res[f"{tag}/counts_fwd"]
            assert counts.get("all_to_all", 0) == 4 * layers, counts
            assert counts.get("all_gather", 0) == layers + 2, counts
    imports = max(res["t_import"] - res["t_entry"] for res in results.values())
    print(
        f"\n4-rank SP job wall {wall:.1f} s (imports in the ranks up to {imports:.1f} s); rank0 fwd sp2 {results[0]['sp2/fwd_s'] * 1e3:.0f} ms, "
        f"fwd+bwd sp2 {results[0]['sp2/fwd_bwd_s'] * 1e3:.0f} ms, fwd sp4 {results[0]['sp4/fwd_s'] * 1e3:.0f} ms"
    )


# ---- (d) single-process helpers == verl 0.9.1 ----------------------------------------------------------------------
def test_unpad_pad_parity_with_verl():
    va = pytest.importorskip("verl.utils.attention_utils")
    rng = np.random.default_rng(1)
    for trial in range(300):
        bsz, seqlen = int(rng.integers(1, 7)), int(rng.integers(1, 13))
        mask = torch.from_numpy((rng.random((bsz, seqlen)) < rng.random()).astype(np.int64))
        if trial % 10 == 0:
            mask[0] = 0  # an empty row
        x = torch.from_numpy(rng.normal(size=(bsz, seqlen, 3)))
        ours, theirs = unpad_input(x, mask), va.unpad_input(x, mask)
        for a, b in zip(ours[:3] + ours[4:], theirs[:3] + theirs[4:]):
            assert a.dtype == b.dtype and torch.equal(a, b), trial
        assert ours[3] == theirs[3]
        back = pad_input(ours[0], ours[1], bsz, seqlen)
        assert torch.equal(back, va.pad_input(theirs[0], theirs[1], bsz, seqlen))
        assert torch.equal(back, x * mask[..., None])
        flat = x.reshape(-1, 3)
        assert torch.equal(index_first_axis(flat, ours[1]), va.index_first_axis(flat, theirs[1]))


def test_ulysses_pad_and_slice_parity_with_verl(monkeypatch):
    vu = pytest.importorskip("verl.utils.ulysses")
    rng = np.random.default_rng(2)
    state = {"sp": 1, "rank": 0}
    # verl's slice_input_tensor asks torch.distributed for the SP size and rank: answer without a process group.
    monkeypatch.setattr(vu, "dist", type("D", (), {"get_world_size": staticmethod(lambda group=None: state["sp"])}))
    monkeypatch.setattr(vu, "get_ulysses_sequence_parallel_rank", lambda group=None: state["rank"])
    for trial in range(400):
        nnz, sp = int(rng.integers(1, 40)), int(rng.choice([1, 2, 3, 4, 8]))
        ids = torch.from_numpy(rng.integers(1, 100, size=(1, nnz)))
        pos = torch.from_numpy(rng.integers(0, 30, size=(1, nnz)))
        a, b = ulysses_pad(ids, pos, sp), vu.ulysses_pad(ids, pos, sp)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2] == (-nnz) % sp, trial
        assert torch.equal(ulysses_pad(ids, None, sp)[0], vu.ulysses_pad(ids, None, sp)[0])
        state["sp"] = sp
        parts = []
        for r in range(sp):
            state["rank"] = r
            ours = ulysses_pad_and_slice_inputs(ids, pos, sp_size=sp, sp_rank=r)
            theirs = vu.ulysses_pad_and_slice_inputs(ids, pos, sp_size=sp)
            assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1]) and ours[2] == theirs[2]
            parts.append(ours[0])
        assert torch.equal(torch.cat(parts, dim=1), a[0])  # contiguous slices tile the padded row
        assert all(p.shape[1] == (nnz + a[2]) // sp for p in parts)


def test_slice_rejects_indivisible():
    with pytest.raises(ValueError, match="not divisible by sp_size 2"):
        slice_input_tensor(torch.zeros(1, 5), 1, 2, 0)


# ---- (e) verl's exact head-constraint messages, and the remaining bad inputs --------------------------------------
class _Passed(Exception):
    pass


class _Cfg:
    def __init__(self, h, kv):
        self.num_attention_heads, self.num_key_value_heads = h, kv

    @property
    def model_type(self):  # verl reads this right after its asserts: reaching it means both asserts passed
        raise _Passed


def test_head_constraint_messages_match_verl():
    mp = pytest.importorskip("verl.models.transformers.monkey_patch")
    fake = type("FakeModel", (), {"__module__": __name__})()
    seen = set()
    for h in (1, 2, 3, 4, 6, 8, 12, 16):
        for kv in (1, 2, 3, 4, 8):
            for sp in (1, 2, 3, 4, 8):
                fake.config = _Cfg(h, kv)
                try:
                    mp.apply_monkey_patch(fake, ulysses_sp_size=sp)
                except _Passed:
                    verl_msg = None
                except AssertionError as e:
                    verl_msg = str(e)
                try:
                    check_ulysses_heads(h, kv, sp)
                    ours = None
                except AssertionError as e:
                    ours = str(e)
                assert ours == verl_msg, (h, kv, sp)
                seen.add(None if ours is None else ours.split()[0])
    assert seen == {None, "num_attention_heads", "num_key_value_heads"}  # E41, E42 and the pass case all occurred


def test_bad_inputs_raise(model, batches, monkeypatch):
    import copy

    import labkit.model.logprob as lp_mod

    micro = R.to_micro(batches["even"])
    monkeypatch.setattr(lp_mod, "_sp_size", lambda group: 2)  # an SP=2 group, without a process group
    with pytest.raises(ValueError) as e12:
        forward_micro_batch(model, micro, use_remove_padding=False, sp_group=object())
    with pytest.raises(ValueError, match="apply_ulysses_patch"):
        forward_micro_batch(model, micro, use_remove_padding=True, sp_group=object())
    monkeypatch.undo()
    assert str(e12.value) == E12_SP_NEEDS_RMPAD
    with pytest.raises(AssertionError, match="num_attention_heads 4 must be divisible by ulysses_sp_size 8"):
        apply_ulysses_patch(copy.deepcopy(model), 8)
    with pytest.raises(KeyError, match="responses"):
        forward_micro_batch(model, {k: v for k, v in micro.items() if k != "responses"}, use_remove_padding=True)


def test_all_padding_micro_batch(model, batches):
    """An all-zero attention mask (verl feeds sp dummy tokens) gives zeros, not an error."""
    micro = R.to_micro(batches["even"])
    micro["attention_mask"] = torch.zeros_like(micro["attention_mask"])
    micro["position_ids"] = compute_position_id_with_mask(micro["attention_mask"])
    with torch.no_grad():
        lp, ent = forward_micro_batch(model, micro, use_remove_padding=True, calculate_entropy=True)
    assert lp.shape == ent.shape == micro["responses"].shape and not lp.any() and not ent.any()
