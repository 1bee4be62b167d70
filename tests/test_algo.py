"""labkit.rl.algo against verl: 0.9.1 in-process (engine profile), 0.7.1 in one subprocess (legacy profile), on
random inputs; plus the micro-batch invariance of global denominators and the chunked log-prob's memory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from labkit.model import logits as logits_fn
from labkit.rl import algo

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
verl_F = pytest.importorskip("verl.utils.torch_functional")
ActorConfig = pytest.importorskip("verl.workers.config.actor").ActorConfig

ORACLE_071 = Path(__file__).resolve().parents[1] / ".oracle" / "verl-0.7.1"
N_CASES = 1000
ENGINE_MODES = algo.LOSS_AGG_MODES["engine"]
LEGACY_MODES = algo.LOSS_AGG_MODES["legacy"]
EXACT = dict(rtol=0, atol=0, equal_nan=True)  # same ops in the same order as verl ⇒ bit-identical


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only add contention on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------ random inputs


def _mask(rng: np.random.Generator, bsz: int, width: int) -> torch.Tensor:
    """Response masks: right-padded prefixes (the real shape), scattered bits, or full; empty rows included."""
    kind = rng.integers(3)
    if kind == 0:
        mask = np.arange(width)[None, :] < rng.integers(0, width + 1, bsz)[:, None]
    elif kind == 1:
        mask = rng.random((bsz, width)) < rng.random()
    else:
        mask = np.ones((bsz, width), bool)
        mask[rng.random(bsz) < 0.2] = False
    return torch.from_numpy(mask.astype(np.float32))


def _global_info(rng: np.random.Generator, mask: torch.Tensor) -> dict:
    """What the engine's ppo_loss writes into config.global_batch_info for one micro-batch."""
    if rng.random() < 0.3:
        return dict(dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None)
    return dict(
        dp_size=int(rng.integers(1, 9)),
        batch_num_tokens=int(mask.sum()) + int(rng.integers(1, 50)),
        global_batch_size=mask.shape[0] + int(rng.integers(0, 20)),
        loss_scale_factor=None if rng.random() < 0.5 else int(rng.integers(1, 4096)),
    )


def _case(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    bsz, width = int(rng.integers(1, 9)), int(rng.integers(1, 13))
    scale = 10.0 ** rng.integers(-2, 3)
    return torch.from_numpy((rng.standard_normal((bsz, width)) * scale).astype(np.float32)), _mask(rng, bsz, width)


def _same(mine: torch.Tensor, ref: torch.Tensor) -> None:
    """Bit-identical (NaN where verl has NaN); torch.equal first because assert_close is slow on 1,000s of calls."""
    if not (mine.dtype == ref.dtype and mine.shape == ref.shape and torch.equal(mine.nan_to_num(), ref.nan_to_num())
            and torch.equal(mine.isnan(), ref.isnan())):  # fmt: skip
        torch.testing.assert_close(mine, ref, **EXACT)


def _raised(fn):
    try:
        return fn(), None
    except Exception as exc:  # noqa: BLE001 - we compare the exception itself
        return None, (type(exc).__name__, str(exc))


# ------------------------------------------------------------------------------------------ GRPO


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_advantage_matches_verl(norm: bool) -> None:
    rng = np.random.default_rng(1 + norm)
    singletons = ties = 0
    for _ in range(N_CASES):
        bsz, width = int(rng.integers(1, 17)), int(rng.integers(1, 9))
        mask = _mask(rng, bsz, width)
        if rng.random() < 0.6:  # outcome reward on one token, values from a small set ⇒ ties, zero-std groups
            rewards = torch.zeros(bsz, width)
            rewards[torch.arange(bsz), torch.from_numpy(rng.integers(0, width, bsz))] = torch.from_numpy(
                rng.choice([0.0, 0.5, 1.0], bsz).astype(np.float32)
            )
        else:
            rewards = torch.from_numpy(rng.standard_normal((bsz, width)).astype(np.float32)) * mask
        if rng.random() < 0.5:  # float64 rewards: verl's group-of-one scalars stay float32
            rewards = rewards.double() * float(10 ** rng.integers(0, 3))
        pool = [f"uid-{k}" for k in range(int(rng.integers(1, bsz + 1)))]
        if rng.random() < 0.3:
            pool = [int(rng.integers(-(10**6), 10**6)) for _ in pool]
        index = np.array([pool[k] for k in rng.integers(0, len(pool), bsz)], dtype=object)  # any order
        counts = {u: list(index).count(u) for u in index}
        singletons += any(c == 1 for c in counts.values())
        ties += bool(torch.unique(rewards.sum(-1)).numel() < bsz)
        adv, ret = algo.grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
        ref_adv, ref_ret = core_algos.compute_grpo_outcome_advantage(
            rewards.clone(), mask, index, norm_adv_by_std_in_grpo=norm
        )
        _same(adv, ref_adv)
        _same(ret, ref_ret)
    assert singletons > 100 and ties > 100  # the edge cases were really exercised


def test_grpo_singleton_is_not_zero_and_bad_index() -> None:
    """GRPO worked example: a group of one keeps mean 0, std 1 ⇒ advantage = score / (1 + 1e-6), not 0."""
    adv, _ = algo.grpo_outcome_advantage(torch.tensor([[0.0, 2.0]]), torch.ones(1, 2), np.array(["a"]))
    assert torch.allclose(adv, torch.full((1, 2), 2.0 / (1 + 1e-6)))
    with pytest.raises(ValueError, match="index has 1 uids but token_level_rewards has 2 rows"):
        algo.grpo_outcome_advantage(torch.zeros(2, 3), torch.ones(2, 3), ["a"])


def test_grpo_singleton_float64_rounds_one_plus_epsilon_in_float32_as_verl() -> None:
    """A float64 group of one: verl's std is the float32 scalar torch.tensor(1.0), so 1 + 1e-3 is rounded to
    float32 before the float64 division (99.90009523642797, not 100 / 1.001)."""
    rewards, index = torch.tensor([[100.0]], dtype=torch.float64), np.array([0])
    mine, _ = algo.grpo_outcome_advantage(rewards, torch.ones(1, 1), index, epsilon=1e-3)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), torch.ones(1, 1), index, epsilon=1e-3)
    assert mine.dtype == theirs.dtype == torch.float64
    assert mine.item() == theirs.item() != 100.0 / 1.001
    assert mine.item() == 100.0 / float(torch.tensor(1.0) + 1e-3)


# ------------------------------------------------------------------------------------------ agg_loss


def test_agg_loss_engine_matches_verl_091() -> None:
    rng = np.random.default_rng(3)
    errors = 0
    for i in range(N_CASES):
        loss_mat, mask = _case(rng)
        if i % 2:
            mask = mask.bool()  # the engine's ppo_loss passes a bool mask
        mode = ENGINE_MODES[i % len(ENGINE_MODES)]
        info = _global_info(rng, mask)
        if rng.random() < 0.15:  # dp_size > 1 without denominators ⇒ E43
            info.update(dp_size=int(rng.integers(2, 5)), batch_num_tokens=None, global_batch_size=None)
        mine, my_err = _raised(lambda: algo.agg_loss(loss_mat, mask, mode, profile="engine", **info))
        ref, ref_err = _raised(lambda: core_algos.agg_loss(loss_mat, mask, mode, **info))
        assert my_err == ref_err
        errors += my_err is not None
        if ref_err is None:
            _same(mine, ref)
    assert errors > 50


@pytest.mark.parametrize("profile", ["legacy", "engine"])
def test_agg_loss_error_messages(profile: str) -> None:
    m, mask = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"^Invalid loss_agg_mode: seq-sum$"):
        algo.agg_loss(m, mask, "seq-sum", profile=profile)
    with pytest.raises(ValueError, match=r"^\(global\) batch_num_tokens is required when dp_size > 1$"):
        algo.agg_loss(m, mask, "token-mean", profile=profile, dp_size=2)
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        with pytest.raises(ValueError, match=r"^global_batch_size is required when dp_size > 1$"):
            algo.agg_loss(m, mask, mode, profile=profile, dp_size=2)
    if profile == "legacy":  # token-sum arrived with 0.9.1 (E8 before)
        with pytest.raises(ValueError, match=r"^Invalid loss_agg_mode: token-sum$"):
            algo.agg_loss(m, mask, "token-sum", profile=profile)
    with pytest.raises(ValueError, match="profile must be one of"):
        algo.agg_loss(m, mask, "token-mean", profile="0.8")


# ------------------------------------------------------------------------------------------ PPO loss


def test_policy_loss_matches_verl_091() -> None:
    rng = np.random.default_rng(4)
    clipped_lower = 0
    for i in range(N_CASES):
        adv, mask = _case(rng)
        adv[torch.from_numpy(rng.random(adv.shape) < 0.1)] = 0.0
        old = torch.from_numpy(rng.standard_normal(adv.shape).astype(np.float32)) - 2
        delta = torch.from_numpy(rng.standard_normal(adv.shape).astype(np.float32)) * 10.0 ** rng.integers(-2, 2)
        if rng.random() < 0.05:
            delta = delta * 100  # beyond the ±20 clamp
        low, high = float(rng.uniform(0.05, 0.4)), float(rng.uniform(0.05, 0.5))
        c, mode = float(rng.uniform(1.05, 5.0)), ENGINE_MODES[i % len(ENGINE_MODES)]
        info = _global_info(rng, mask)
        weights = None if rng.random() < 0.8 else torch.rand(adv.shape)
        cfg = ActorConfig(
            strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, clip_ratio_low=low, clip_ratio_high=high,
            clip_ratio_c=c, loss_agg_mode=mode, loss_scale_factor=info["loss_scale_factor"],
        )  # fmt: skip
        cfg.global_batch_info.update(info)  # as verl/workers/utils/losses.py: ppo_loss does
        logp, ref_logp = (old + delta).requires_grad_(), (old + delta).requires_grad_()
        loss, metrics = algo.policy_loss_vanilla(
            old, logp, adv, mask.bool(), loss_agg_mode=mode, clip_ratio_low=low, clip_ratio_high=high,
            clip_ratio_c=c, profile="engine", global_batch_info=info, rollout_is_weights=weights,
        )  # fmt: skip
        ref_loss, ref_metrics = core_algos.compute_policy_loss_vanilla(
            old, ref_logp, adv, mask.bool(), mode, cfg, rollout_is_weights=weights
        )
        _same(loss, ref_loss)
        assert metrics == ref_metrics
        loss.backward(), ref_loss.backward()
        _same(logp.grad, ref_logp.grad)
        clipped_lower += metrics["actor/pg_clipfrac_lower"] > 0
    assert clipped_lower > 20  # the dual clip was reached
    with pytest.raises(AssertionError, match="should be greater than 1.0, but get the value: 1.0."):
        algo.policy_loss_vanilla(old, old, adv, mask, clip_ratio_c=1.0)


# ------------------------------------------------------------------------------------------ KL, entropy


def test_kl_penalty_values_and_gradients_match_verl() -> None:
    rng = np.random.default_rng(5)
    kinds = [k + plus for k in algo.KL_PENALTY_TYPES for plus in ("", "+")]
    for i in range(N_CASES):
        shape = tuple(int(s) for s in rng.integers(1, 9, size=int(rng.integers(1, 3))))
        spread = 10.0 ** rng.integers(-3, 2)  # up to Δ ≈ ±50: both ±20 and ±10 clamps of k3 are hit
        lp = torch.from_numpy((rng.standard_normal(shape) * spread).astype(np.float32))
        ref = torch.from_numpy((rng.standard_normal(shape) * spread).astype(np.float32))
        kind = kinds[i % len(kinds)]
        a, b = lp.clone().requires_grad_(), ref.clone().requires_grad_()
        va, vb = lp.clone().requires_grad_(), ref.clone().requires_grad_()
        mine, theirs = algo.kl_penalty(a, b, kind, profile="engine"), core_algos.kl_penalty(va, vb, kind)
        _same(mine, theirs)
        upstream = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
        mine.backward(upstream), theirs.backward(upstream)
        _same(a.grad, va.grad)
        _same(b.grad, vb.grad)
        if kind.endswith("+"):  # straight-through: value of the base estimator, gradient of k2
            _same(mine, algo.kl_penalty_forward(lp, ref, kind[:-1]))
            _same(a.grad, upstream * (lp - ref))
    for bad in ("full", "k4", "k3++"):
        with pytest.raises(NotImplementedError) as verl_error:
            core_algos.kl_penalty(lp, ref, bad)
        assert str(verl_error.value) == ""  # verl's has no message (catalogue X5); labkit's names the choices
        for profile in ("engine", "legacy"):
            with pytest.raises(NotImplementedError, match="is not implemented"):
                algo.kl_penalty(lp, ref, bad, profile=profile)


def test_entropy_and_plain_logprobs_match_verl() -> None:
    gen = torch.Generator().manual_seed(6)
    for _ in range(50):
        logits = torch.randn(3, int(torch.randint(1, 20, (1,), generator=gen)), 37, generator=gen) * 5
        labels = torch.randint(0, 37, logits.shape[:-1], generator=gen)
        _same(logits_fn.entropy_from_logits(logits), verl_F.entropy_from_logits(logits))
        mine = logits_fn.logprobs_from_logits(logits, labels)
        _same(mine, verl_F.logprobs_from_logits_naive(logits, labels))
        # verl's CPU default (logprobs_from_logits_v2: gather − logsumexp) rounds differently: fp32 tolerance
        torch.testing.assert_close(mine, verl_F.logprobs_from_logits(logits, labels), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ chunked log-probs


def _naive(x: torch.Tensor, labels: torch.Tensor, temp: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    z = x if weight is None else x @ weight.T
    return logits_fn.logprobs_from_logits((z / temp).float(), labels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_logprobs_equal_naive(dtype: torch.dtype) -> None:
    """Logits input: bit-identical values (rows are independent); gradients within 2 fp32 ulps (torch's
    log_softmax backward kernel rounds g − e^logp·g differently; in bf16 that can flip one bf16 ulp). Hidden
    input (fused LM head): the chunked matmul may round differently, so fp32 1e-5 (bf16 inputs: 2e-2)."""
    gen = torch.Generator().manual_seed(7)
    for chunk in (1, 5, 64, 1000):
        x = (torch.randn(4, 13, 211, generator=gen) * 4).to(dtype)
        labels = torch.randint(0, 211, (4, 13), generator=gen)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, ref = logits_fn.logprobs_from_logits_chunked(a, labels, chunk, temperature=0.7), _naive(b, labels, 0.7)
        assert out.dtype == torch.float32 and out.shape == labels.shape
        _same(out, ref)
        g = torch.randn(labels.shape, generator=gen)
        out.backward(g), ref.backward(g)
        ulps = dict(rtol=2.4e-7, atol=2.4e-7) if dtype == torch.float32 else dict(rtol=7.9e-3, atol=1e-6)
        torch.testing.assert_close(a.grad, b.grad, **ulps)

        h, w = (torch.randn(52, 16, generator=gen)).to(dtype), (torch.randn(211, 16, generator=gen) / 4).to(dtype)
        flat = labels.reshape(-1)
        h1, w1, h2, w2 = (t.clone().requires_grad_() for t in (h, w, h, w))
        out = logits_fn.logprobs_from_logits_chunked(h1, flat, chunk, lm_head_weight=w1, temperature=0.7)
        ref = _naive(h2, flat, 0.7, w2)
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(out, ref, **tol)
        out.backward(g.reshape(-1)), ref.backward(g.reshape(-1))
        torch.testing.assert_close(h1.grad, h2.grad, **tol)
        torch.testing.assert_close(w1.grad, w2.grad, **tol)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        logits_fn.logprobs_from_logits_chunked(x, labels, 0)


def _peak_cpu_bytes(fn) -> int:
    """Peak of live CPU tensor bytes allocated inside ``fn``: torch.profiler(profile_memory=True) records every
    allocation (on the op that made it) and every free ([memory] events); summed in time order, the max is the peak."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage)
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def test_chunked_logprobs_peak_temporary_is_smaller() -> None:
    """bf16 logits N×V: naive makes an N×V fp32 copy plus an N×V fp32 log_softmax (≥ 8·N·V bytes); the chunked
    path only chunk×V fp32 temporaries. Forward and forward+backward are both measured."""
    n, vocab, chunk = 2048, 1024, 128
    x = torch.randn(n, vocab).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (n,))
    naive_fwd = _peak_cpu_bytes(lambda: _naive(x, labels, 1.0))
    chunk_fwd = _peak_cpu_bytes(lambda: logits_fn.logprobs_from_logits_chunked(x, labels, chunk))
    assert naive_fwd >= 8 * n * vocab
    assert chunk_fwd <= 12 * chunk * vocab + 16 * n  # fp32 z + log_softmax (+ bf16 z) per chunk, row vectors
    xg = x.clone().requires_grad_()
    naive_both = _peak_cpu_bytes(lambda: _naive(xg, labels, 1.0).sum().backward())
    chunk_both = _peak_cpu_bytes(lambda: logits_fn.logprobs_from_logits_chunked(xg, labels, chunk).sum().backward())
    assert chunk_both < naive_both / 2, (chunk_both, naive_both)  # only the bf16 N×V gradient is full-size


# ------------------------------------------------------------------------------------------ invariance


def _split(rng: np.random.Generator, rows: int, parts: int) -> list[np.ndarray]:
    """An arbitrary partition of ``rows`` into ``parts`` non-empty groups of any rows (not only contiguous)."""
    perm, cuts = rng.permutation(rows), np.sort(rng.choice(np.arange(1, rows), parts - 1, replace=False))
    return np.split(perm, cuts)


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_engine_global_denominators_are_split_invariant(mode: str) -> None:
    """Engine: Σ over micro-batches (per rank) of agg_loss with global denominators × D, averaged over the D
    ranks as FSDP averages gradients, equals the whole mini-batch's loss — values and gradients, fp64."""
    rng = np.random.default_rng(8)
    for _ in range(60):
        rows, width = int(rng.integers(4, 33)), int(rng.integers(1, 17))
        loss_mat = torch.from_numpy(rng.standard_normal((rows, width))).requires_grad_()
        mask = _mask(rng, rows, width).double()
        mask[0, 0] = 1.0  # at least one token, else token-mean is 0/0 on both sides
        info = dict(batch_num_tokens=int(mask.sum()), global_batch_size=rows, loss_scale_factor=None)
        whole = algo.agg_loss(loss_mat, mask, mode, profile="engine", **info)
        (grad_whole,) = torch.autograd.grad(whole, loss_mat)
        dp = int(rng.integers(1, min(rows, 8) // 2 + 1))
        total = 0.0
        for rank_rows in _split(rng, rows, dp):
            for micro in _split(rng, len(rank_rows), int(rng.integers(1, len(rank_rows) + 1))):
                idx = torch.from_numpy(rank_rows[micro])
                total = total + algo.agg_loss(loss_mat[idx], mask[idx], mode, profile="engine", dp_size=dp, **info)
        split = total / dp  # FSDP's gradient all-reduce is a mean over the DP ranks
        (grad_split,) = torch.autograd.grad(split, loss_mat)
        torch.testing.assert_close(split, whole, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad_split, grad_whole, rtol=1e-12, atol=1e-12)
        if mode == "token-mean":  # (masked_mean would add its 1e-8 guard to the denominator)
            torch.testing.assert_close(whole, algo.masked_sum(loss_mat, mask) / mask.sum(), rtol=1e-12, atol=1e-12)


def test_legacy_micro_mean_over_ga_differs_from_token_mean() -> None:
    """Worked example: M′ = 4 rows, m = 2 ⇒ GA = 2. Micro-batch 1 = two 1-token rows with loss 1; micro-batch 2 =
    two 8-token rows with loss 0. Legacy: (1·½ + 0·½) = 0.5; token mean = 2/18 ≈ 0.111; engine gives 0.111."""
    loss = torch.tensor([[1.0] + [0.0] * 7] * 2 + [[0.0] * 8] * 2, dtype=torch.float64)
    mask = torch.tensor([[1.0] + [0.0] * 7] * 2 + [[1.0] * 8] * 2, dtype=torch.float64)
    micros = [slice(0, 2), slice(2, 4)]
    s = algo.micro_batch_loss_scale("legacy", "static", rows_in_micro=2, normalized_mini=4, ga=4 // 2)
    legacy = sum(algo.agg_loss(loss[m], mask[m], "token-mean", profile="legacy") * s for m in micros)
    engine = sum(
        algo.agg_loss(loss[m], mask[m], "token-mean", profile="engine", batch_num_tokens=int(mask.sum()))
        * algo.micro_batch_loss_scale("engine", "static", 2, 4, 2)
        for m in micros
    )
    token_mean = algo.masked_sum(loss, mask) / mask.sum()
    assert float(legacy) == pytest.approx(0.5) and float(token_mean) == pytest.approx(2 / 18)
    assert float(engine) == pytest.approx(float(token_mean), abs=1e-15)
    assert abs(float(legacy) - float(token_mean)) > 0.3
    # dynamic legacy scale rows/M′ also sums to 1 over a full mini-batch, and under-weights a short one
    assert sum(algo.micro_batch_loss_scale("legacy", "dynamic", r, 8, None) for r in (3, 1, 4)) == 1.0
    assert sum(algo.micro_batch_loss_scale("legacy", "dynamic", r, 8, None) for r in (3, 1)) == 0.5
    with pytest.raises(ValueError, match="gradient_accumulation"):
        algo.micro_batch_loss_scale("legacy", "static", 2, 1, 0)


# ------------------------------------------------------------------------------------------ legacy (0.7.1)

_LEGACY_SCRIPT = r"""
import json, sys, torch
from verl.trainer.ppo import core_algos
from verl.workers.config.actor import ActorConfig
assert core_algos.__file__.startswith(sys.argv[1]), core_algos.__file__
def run(fn):
    try:
        out = fn()
        return {"value": out.item() if hasattr(out, "item") else out}
    except Exception as exc:
        return {"error": [type(exc).__name__, str(exc)]}
results = []
for case in json.load(sys.stdin):
    t = lambda k: torch.tensor(case[k], dtype=torch.float32)
    if case["kind"] == "agg":
        results.append(run(lambda: core_algos.agg_loss(t("loss"), t("mask"), case["mode"], **case["info"])))
    elif case["kind"] == "pg":
        cfg = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, loss_agg_mode=case["mode"],
                          clip_ratio_low=case["low"], clip_ratio_high=case["high"], clip_ratio_c=case["c"])
        r = run(lambda: core_algos.compute_policy_loss_vanilla(t("old"), t("new"), t("adv"), t("mask"),
                                                               case["mode"], cfg))
        if "value" in r:
            r = {"value": [r["value"][0].item(), r["value"][1]]}
        results.append(r)
    else:
        results.append(run(lambda: core_algos.kl_penalty(t("a"), t("b"), case["type"]).tolist()))
json.dump(results, sys.stdout)
"""


def _legacy_cases() -> list[dict]:
    rng = np.random.default_rng(9)
    cases = []
    for i in range(N_CASES):
        loss, mask = _case(rng)
        info = {} if rng.random() < 0.6 else {k: v for k, v in _global_info(rng, mask).items() if v is not None}
        if rng.random() < 0.1:
            info = {"dp_size": 2}  # E43 exists in 0.7.1's agg_loss too
        mode = (*LEGACY_MODES, "token-sum")[i % 5]
        cases.append(dict(kind="agg", loss=loss.tolist(), mask=mask.tolist(), mode=mode, info=info))
    for i in range(200):  # the legacy dp_actor calls the policy loss with an empty global_batch_info
        adv, mask = _case(rng)
        old = rng.standard_normal(adv.shape) - 2
        new = old + rng.standard_normal(adv.shape) * 0.3
        cases.append(dict(kind="pg", adv=adv.tolist(), mask=mask.tolist(), old=old.tolist(), new=new.tolist(),
                          mode=LEGACY_MODES[i % 4], low=float(rng.uniform(0.05, 0.4)),
                          high=float(rng.uniform(0.05, 0.5)), c=float(rng.uniform(1.05, 5.0))))  # fmt: skip
    for kind in ("k1", "k3", "low_var_kl", "k1+", "k3+"):  # finding: 0.7.1 raises on "+" names
        cases.append(dict(kind="kl", a=[0.1, -2.0], b=[0.3, 0.0], type=kind))
    return cases


@pytest.fixture(scope="module")
def legacy_oracle():
    """Start verl 0.7.1 in one subprocess right away, so its ~15 s import overlaps the in-process tests."""
    if not (ORACLE_071 / "verl").is_dir():
        pytest.skip(f"verl 0.7.1 oracle missing at {ORACLE_071} (run `make venv` to unpack it)")
    cases = _legacy_cases()
    env = {**os.environ, "PYTHONPATH": str(ORACLE_071)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _LEGACY_SCRIPT, str(ORACLE_071)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    yield cases, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _start_legacy_early(request):
    if (ORACLE_071 / "verl").is_dir():
        request.getfixturevalue("legacy_oracle")


def test_legacy_matches_verl_071(legacy_oracle) -> None:
    cases, proc = legacy_oracle
    out, err = proc.communicate(json.dumps(cases), timeout=300)
    assert proc.returncode == 0, err[-3000:]
    results = json.loads(out)
    assert len(results) == len(cases)
    seen_errors = set()
    for case, res in zip(cases, results):
        t = lambda k: torch.tensor(case[k], dtype=torch.float32)  # noqa: E731
        if case["kind"] == "agg":
            mine, my_err = _raised(lambda: algo.agg_loss(t("loss"), t("mask"), case["mode"], profile="legacy",
                                                         **case["info"]))  # fmt: skip
        elif case["kind"] == "pg":
            mine, my_err = _raised(lambda: algo.policy_loss_vanilla(
                t("old"), t("new"), t("adv"), t("mask"), loss_agg_mode=case["mode"], clip_ratio_low=case["low"],
                clip_ratio_high=case["high"], clip_ratio_c=case["c"], profile="legacy"))  # fmt: skip
            mine = None if mine is None else [mine[0].item(), mine[1]]
        else:
            continue  # KL probes: compared below
        if "error" in res:
            assert my_err == tuple(res["error"]), (case["mode"], case.get("info"))
            seen_errors.add(res["error"][1])
        else:
            assert my_err is None, my_err
            got = mine.item() if hasattr(mine, "item") else mine
            np.testing.assert_equal(got, res["value"])  # bit-identical (NaN == NaN)
    assert seen_errors == {"Invalid loss_agg_mode: token-sum", "(global) batch_num_tokens is required when dp_size > 1",
                           "global_batch_size is required when dp_size > 1"}  # fmt: skip
    kl = {c["type"]: r for c, r in zip(cases, results) if c["kind"] == "kl"}
    for name in ("k1", "k3", "low_var_kl"):  # values agree with labkit (= 0.9.1)
        torch.testing.assert_close(
            torch.tensor(kl[name]["value"]),
            algo.kl_penalty(torch.tensor([0.1, -2.0]), torch.tensor([0.3, 0.0]), name, profile="legacy"),
        )
    for name in ("k1+", "k3+"):  # 0.7.1 raises on "+" names (fixed in 0.9.1): legacy raises the same type
        assert kl[name]["error"][0] == "NotImplementedError"
        _, err = _raised(
            lambda: algo.kl_penalty(torch.tensor([0.1, -2.0]), torch.tensor([0.3, 0.0]), name, profile="legacy")
        )
        assert err is not None and err[0] == kl[name]["error"][0], err
        assert algo.kl_penalty(torch.tensor([0.1]), torch.tensor([0.3]), name, profile="engine").shape == (1,)


# ------------------------------------------------------------------------------------------ KL in the reward


def test_kl_in_reward_matches_verl_apply_kl_penalty() -> None:
    """labkit.rl.reward.apply_kl_penalty + controllers vs verl 0.9.1's ray_trainer.apply_kl_penalty (compiled from its
    source: ray_trainer.py needs torchdata to import) and core_algos.get_kl_controller, 3 steps per controller."""
    from _oracle_legacy import load_function
    from verl import DataProto as VerlDataProto
    from verl.trainer.config import KLControlConfig

    from labkit.rl import reward

    ns = {"core_algos": core_algos, "masked_mean": verl_F.masked_mean, "torch": torch, "DataProto": VerlDataProto}
    verl_apply = load_function(Path(core_algos.__file__).with_name("ray_trainer.py"), "apply_kl_penalty", ns)
    rng = np.random.default_rng(11)
    for ctrl_type, kind in (("fixed", "kl"), ("adaptive", "low_var_kl"), ("adaptive", "k3+"), ("fixed", "mse")):
        coef, target, horizon = float(rng.uniform(0.01, 0.5)), float(rng.uniform(0.01, 0.2)), int(rng.integers(5, 50))
        theirs_ctrl = core_algos.get_kl_controller(
            KLControlConfig(type=ctrl_type, kl_coef=coef, target_kl=target, horizon=horizon)
        )
        mine_ctrl = reward.kl_controller(ctrl_type, coef, target, horizon)
        for _ in range(3):
            rows, width = int(rng.integers(2, 7)), int(rng.integers(1, 6))
            mask = torch.from_numpy((rng.random((rows, width)) < 0.7).astype(np.int64))
            mask[0] = 0  # an empty response: masked_mean's 1e-8 guard
            old = torch.from_numpy(rng.standard_normal((rows, width)).astype(np.float32)) - 2
            ref = old + torch.from_numpy(rng.standard_normal((rows, width)).astype(np.float32))
            scores = torch.from_numpy(rng.standard_normal((rows, width)).astype(np.float32))
            data = VerlDataProto.from_dict(
                tensors={"response_mask": mask, "token_level_scores": scores, "old_log_probs": old, "ref_log_prob": ref}
            )
            data, theirs = verl_apply(data, kl_ctrl=theirs_ctrl, kl_penalty=kind)
            rewards, mine = reward.apply_kl_penalty(scores, old, ref, mask, mine_ctrl, kind, profile="engine")
            torch.testing.assert_close(rewards, data.batch["token_level_rewards"], **EXACT)
            assert mine == theirs and mine_ctrl.value == theirs_ctrl.value, (ctrl_type, kind, mine, theirs)
        assert ctrl_type == "fixed" or mine_ctrl.value != coef  # the adaptive β moved
    with pytest.raises(AssertionError, match="horizon must be larger than 0. Got 0"):
        core_algos.get_kl_controller(KLControlConfig(type="adaptive", horizon=0))
    with pytest.raises(AssertionError, match="horizon must be larger than 0. Got 0"):
        reward.kl_controller("adaptive", 0.1, 0.1, 0)
    with pytest.raises(NotImplementedError):
        reward.kl_controller("pid", 0.1)
    with pytest.raises(NotImplementedError):  # as 0.7.1's core_algos.kl_penalty, which apply_kl_penalty calls
        reward.apply_kl_penalty(scores, old, ref, mask, mine_ctrl, "k3+", profile="legacy")


def test_kl_controller_reads_algorithm_kl_ctrl() -> None:
    """algorithm.kl_ctrl.* reach the controller; unset: verl's YAML defaults."""
    from labkit.config.verl_config import load_config
    from labkit.rl import reward

    assert reward.kl_controller_from_config(load_config()) == reward.KLController("fixed", 0.001)
    cfg = load_config(
        overrides=[
            "algorithm.use_kl_in_reward=true",
            "algorithm.kl_ctrl.type=adaptive",
            "algorithm.kl_ctrl.kl_coef=0.05",
            "algorithm.kl_ctrl.target_kl=0.2",
            "algorithm.kl_ctrl.horizon=100",
        ],
        profile="legacy",
    )
    assert reward.kl_controller_from_config(cfg) == reward.KLController("adaptive", 0.05, 0.2, 100)
