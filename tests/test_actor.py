"""The training-side actor on real ranks (FSDP2 over gloo, Ulysses SP): log-probs and one PPO update are the same
whatever the micro-batching, padding removal, SP or DP size (fp32, stated tolerances), the legacy profile's per-micro
token-mean scaling differs exactly as the hand computation says, the live trace equals the planner's, bad input fails
with verl's error before any rank waits, and the bf16 drift between micro-batch shapes is measured and printed."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import torch
from _actor_ref import (
    CFG,
    LENGTHS,
    N,
    P,
    R,
    base_settings,
    hand_update,
    initial_params,
    make_batch,
    reference_log_probs,
)

from labkit.config.verl_config import load_config
from labkit.plan.step import plan
from labkit.rl import actor_client as ar
from labkit.rl.actor_math import settings_from_config
from labkit.runtime.worker_group import RankError, live_groups
from labkit.trace import compare

LOGPROB_TOL = 1e-5  # max |Δ log-prob| (and entropy) over response tokens, fp32
UPDATE_RTOL = 1e-5  # max |Δθ_live − Δθ_hand| ≤ UPDATE_RTOL · max |Δθ_hand| (SGD, lr 1: Δθ = −gradient)
COLL_S = 60.0  # collective timeout of every group (generous: the CI machine is shared)
GROUPS = {"dp2": (2, 1), "sp2": (2, 2), "dp2sp2": (4, 2), "dp4": (4, 1)}  # name -> (W, sp); D = W // sp (DP1: sp2)
LONGEST = max(p + r for p, r in LENGTHS)  # 18 = the padded width P + R too
_OPEN: dict = {}
_HAND: dict = {}


def group(name: str):
    """One worker group per (W, sp), started on first use and shared by every test of this module."""
    if name not in _OPEN:
        W, sp = GROUPS[name]
        _OPEN[name] = ar.start_actor_group(
            W, base_settings(sp=sp), launcher="local", collective_timeout_s=COLL_S, timeout_s=300.0
        )
    return _OPEN[name]


@pytest.fixture(scope="module", autouse=True)
def _close_groups():
    yield
    usage = [u for wg in _OPEN.values() for u in wg.usage()]
    if usage:
        print(
            f"\nrank processes: {len(usage)}, CPU {sum(u['cpu_s'] for u in usage):.1f} s, peak RSS "
            f"{max(u['max_rss_mb'] for u in usage):.0f} MB; test process CPU {time.process_time():.1f} s"
        )
    for wg in _OPEN.values():
        wg.close()
        assert wg.alive_pids() == []
    _OPEN.clear()
    assert live_groups() == []


@pytest.fixture(scope="module")
def ref():
    data = make_batch()
    lp, ent = reference_log_probs(data)
    return data, lp, ent, initial_params()


def hand(profile: str, mode: str, dp: int, micro: int | None):
    key = (profile, mode, dp, micro)
    if key not in _HAND:
        _HAND[key] = hand_update(make_batch(), profile, mode, dp, micro)
    return _HAND[key]


def _masked_err(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask.bool()].abs().max())


def _set(wg, rebuild: bool = False, **changes) -> None:
    """Every setting back to base_settings (this group's sp), then ``changes``: no state leaks between tests."""
    base = base_settings(sp=wg.actor_settings.ulysses_sequence_parallel_size).as_dict()
    base.update(changes)
    ar.configure(wg, rebuild=rebuild, **base)


def _update(wg, ref, **changes) -> tuple[dict, dict]:
    """Fresh models (same seed), one update_actor on the reference batch; (Δθ per parameter, reduced metrics)."""
    data, lp, _, init = ref
    _set(wg, rebuild=True, **changes)
    batch = make_batch()
    batch.batch["old_log_probs"] = lp.clone()
    metrics = ar.update_actor(wg, batch)
    after = wg.full_params()[0]
    return {k: after[k] - init[k] for k in init}, metrics


def _micro_sizes(name: str) -> list[int]:
    """Micro sizes dividing the rows of one DP rank (engine E30 otherwise; legacy M′ = N // D needs it too, E21)."""
    W, sp = GROUPS[name]
    return [m for m in (1, 2, 4) if (N // (W // sp)) % m == 0]


def _update_err(delta: dict, expected: dict) -> tuple[float, float]:
    err = max(float(np.abs(delta[k] - expected[k]).max()) for k in expected)
    return err, max(float(np.abs(v).max()) for v in expected.values())


# ---- log-probs --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(GROUPS))
def test_log_probs_invariant_to_micro_batching_rmpad_sp_dp(name, ref):
    """Static m ∈ {1, 2, 4}, dynamic budgets (incl. budget × sp = the longest row), rmpad on/off, both profiles:
    the same old log-probs and entropies as one padded forward in one process; ref log-probs too."""
    data, lp_ref, ent_ref, _ = ref
    wg = group(name)
    W, sp = GROUPS[name]
    mask = data.batch["response_mask"]
    worst = 0.0
    for profile in ("engine", "legacy"):
        for rmpad in (True, False) if sp == 1 else (True,):  # engine rmpad off: rows x the longest row
            configs = [
                dict(use_dynamic_bsz=False, log_prob_use_dynamic_bsz=False, log_prob_micro_batch_size_per_gpu=m)
                for m in _micro_sizes(name)
            ]
            configs += [
                dict(use_dynamic_bsz=True, log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=b)
                for b in (LONGEST // sp, 30 // sp, 200)
            ]
            for c in configs:
                _set(wg, profile=profile, use_remove_padding=rmpad, **c)
                wg.reset_trace()
                out = ar.compute_log_prob(wg, data)
                assert out.batch["old_log_probs"].shape == (N, R)
                err = max(
                    _masked_err(out.batch["old_log_probs"], lp_ref, mask),
                    _masked_err(out.batch["entropys"], ent_ref, mask),
                )
                worst = max(worst, err)
                assert err <= LOGPROB_TOL, (profile, rmpad, c, err)
                n_micro = [r.n_micro for r in wg.trace.at("old_log_prob")]
                assert len(set(n_micro)) == 1  # every rank ran the same number of forwards (FSDP needs it)
    out = ar.compute_ref_log_prob(wg, data)
    assert _masked_err(out.batch["ref_log_prob"], lp_ref, mask) <= LOGPROB_TOL
    print(f"\n[{name}] W={W} sp={sp}: worst |Δ log-prob| over all micro-batchings = {worst:.2e}")


# ---- one update -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(GROUPS))
def test_update_invariant_engine_and_legacy_difference(name, ref):
    """engine token-mean (global denominators): the same update for static m ∈ {1, 2, 4} and dynamic budgets, equal
    to the hand gradient of the global token mean. legacy token-mean: per-micro mean × 1/GA, so m=1 and m=4 give
    different updates (response lengths differ), each equal to its hand computation. seq-mean-token-mean: the profiles
    agree (legacy static, legacy dynamic and engine give one update)."""
    wg = group(name)
    W, sp = GROUPS[name]
    D = W // sp
    report = []

    def check(expected, **changes):
        delta, metrics = _update(wg, ref, **changes)
        err, scale = _update_err(delta, expected[0])
        report.append(f"{changes}: err {err:.1e} / {scale:.1e}")
        assert err <= UPDATE_RTOL * scale, (changes, err, scale)
        assert metrics["actor/pg_loss"] == pytest.approx(expected[1], rel=1e-4, abs=1e-6)
        assert metrics["actor/grad_norm"] == pytest.approx(expected[2], rel=1e-4)
        return delta

    eng = hand("engine", "token-mean", D, None)
    ms = _micro_sizes(name)
    for m in ms:
        check(eng, profile="engine", loss_agg_mode="token-mean", use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=m)
    for b in (LONGEST // sp, 40 // sp):
        check(eng, profile="engine", loss_agg_mode="token-mean", use_dynamic_bsz=True, ppo_max_token_len_per_gpu=b)
    legacy = {
        m: check(
            hand("legacy", "token-mean", D, m),
            profile="legacy",
            loss_agg_mode="token-mean",
            use_dynamic_bsz=False,
            ppo_micro_batch_size_per_gpu=m,
        )
        for m in (1, ms[-1])
    }
    gap, scale = _update_err(legacy[1], legacy[ms[-1]])
    gap_engine, _ = _update_err(legacy[ms[-1]], eng[0])
    assert gap > 1e-2 * scale and gap_engine > 1e-2 * scale, (gap, gap_engine, scale)
    seq = hand("engine", "seq-mean-token-mean", D, None)
    check(
        seq,
        profile="engine",
        loss_agg_mode="seq-mean-token-mean",
        use_dynamic_bsz=False,
        ppo_micro_batch_size_per_gpu=2,
    )
    check(
        seq,
        profile="legacy",
        loss_agg_mode="seq-mean-token-mean",
        use_dynamic_bsz=False,
        ppo_micro_batch_size_per_gpu=2,
    )
    check(
        seq,
        profile="legacy",
        loss_agg_mode="seq-mean-token-mean",
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=LONGEST // sp,
    )
    print(
        f"\n[{name}] legacy token-mean m=1 vs m={ms[-1]}: max |ΔΔθ| = {gap:.3e} (max |Δθ| {scale:.3e}); "
        f"legacy m={ms[-1]} vs engine {gap_engine:.3e}\n  " + "\n  ".join(report)
    )


def test_kl_and_entropy_terms_invariant_engine(ref):
    """engine with the KL loss to the reference (low_var_kl) and an entropy bonus: every term uses the global
    denominators, so static m ∈ {1, 4} and a dynamic budget give the same update; legacy does not (local means)."""
    wg = group("dp2")
    data, lp, _, init = ref
    terms = dict(use_kl_loss=True, kl_loss_coef=0.5, entropy_coeff=0.1, loss_agg_mode="token-mean")
    deltas, metrics = [], []
    for profile, changes in [
        ("engine", dict(ppo_micro_batch_size_per_gpu=1)),
        ("engine", dict(ppo_micro_batch_size_per_gpu=4)),
        ("engine", dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=LONGEST)),
        ("legacy", dict(ppo_micro_batch_size_per_gpu=1)),
        ("legacy", dict(ppo_micro_batch_size_per_gpu=4)),
    ]:
        _set(wg, rebuild=True, profile=profile, **terms, **changes)
        batch = make_batch()
        batch.batch["old_log_probs"] = lp.clone()
        batch.batch["ref_log_prob"] = lp + 0.3 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
        metrics.append(ar.update_actor(wg, batch))
        after = wg.full_params()[0]
        deltas.append({k: after[k] - init[k] for k in init})
    for d in deltas[1:3]:
        err, scale = _update_err(d, deltas[0])
        assert err <= UPDATE_RTOL * scale, (err, scale)
    gap, scale = _update_err(deltas[3], deltas[4])
    assert gap > 1e-2 * scale
    for key in ("actor/kl_loss", "actor/entropy_loss", "actor/pg_loss"):  # engine: Σ_micro of global-denominator terms
        assert metrics[0][key] == pytest.approx(metrics[1][key], rel=1e-4, abs=1e-7)
        assert metrics[0][key] == pytest.approx(metrics[2][key], rel=1e-4, abs=1e-7)
    assert metrics[0]["actor/kl_loss"] > 0 and metrics[0]["actor/entropy_loss"] > 0
    for m in metrics[:3]:  # engine_workers._postprocess_output: Σ_micro of the full loss, DP-averaged
        assert m["actor/loss"] == pytest.approx(
            m["actor/pg_loss"] - 0.1 * m["actor/entropy_loss"] + 0.5 * m["actor/kl_loss"], rel=1e-5, abs=1e-7
        )
    assert "actor/loss" not in metrics[3]  # 0.7.1 dp_actor.update_policy logs no total loss
    assert {
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/entropy",
        "actor/kl_coef",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/pg_clipfrac_lower",
        "actor/grad_norm",
        "actor/lr",
    } <= set(metrics[3])


def test_settings_from_config_reads_every_verl_key_it_holds():
    """data_loader_seed (the engine's mini-batch shuffle seed), calculate_entropy, optim.weight_decay and
    optim.betas (not a modelled key: a set value lands in cfg.ignored) reach ActorSettings."""
    a = "actor_rollout_ref.actor"
    base = settings_from_config(load_config(profile="engine"))
    assert (base.data_loader_seed, base.calculate_entropy, base.weight_decay, base.betas) == (
        42,
        False,
        0.01,
        (0.9, 0.999),
    )
    s = settings_from_config(
        load_config(
            overrides=[
                f"{a}.data_loader_seed=7",
                f"{a}.shuffle=true",
                f"{a}.calculate_entropy=true",
                f"{a}.optim.weight_decay=0.1",
                f"{a}.optim.betas=[0.8,0.95]",
            ],
            profile="engine",
        )
    )
    assert (s.data_loader_seed, s.shuffle, s.calculate_entropy, s.weight_decay, s.betas) == (
        7,
        True,
        True,
        0.1,
        (0.8, 0.95),
    )
    with pytest.raises(ValueError, match=r"optim.betas must be a list of two numbers, got 0.9"):
        settings_from_config(load_config(overrides=[f"{a}.optim.betas=0.9"], profile="engine"))


def test_grad_clip_and_non_finite_skip(ref):
    """grad_clip below the norm scales the update by clip/norm; a NaN advantage makes the norm non-finite and the
    step is skipped (parameters unchanged), as verl's _optimizer_step."""
    wg = group("dp2")
    grads, _, norm = hand("engine", "token-mean", 2, None)
    delta, metrics = _update(
        wg,
        ref,
        profile="engine",
        loss_agg_mode="token-mean",
        use_dynamic_bsz=False,
        ppo_micro_batch_size_per_gpu=2,
        grad_clip=norm / 4,
    )
    assert metrics["actor/grad_norm"] == pytest.approx(norm, rel=1e-4)
    clipped = {k: v * (norm / 4) / (norm + 1e-6) for k, v in grads.items()}
    err, scale = _update_err(delta, clipped)
    assert err <= UPDATE_RTOL * scale
    _set(wg, rebuild=True)
    data, lp, _, init = ref
    bad = make_batch()
    bad.batch["old_log_probs"] = lp.clone()
    bad.batch["advantages"][0, 0] = float("nan")
    metrics = ar.update_actor(wg, bad)
    assert not np.isfinite(metrics["actor/grad_norm"])
    after = wg.full_params()[0]
    assert all(np.array_equal(after[k], init[k]) for k in init)


# ---- trace == plan ----------------------------------------------------------------------------------------------
def _cfg(profile: str, W: int, sp: int, dynamic: bool, m: int, budget: int):
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return load_config(
        profile=profile,
        overrides=[
            f"data.train_batch_size={N}",
            f"{r}.n=1",
            f"trainer.n_gpus_per_node={W}",
            f"{r}.tensor_model_parallel_size=1",
            f"{r}.agent.num_workers=1",
            "trainer.balance_batch=false",
            f"data.max_prompt_length={P}",
            f"data.max_response_length={R}",
            f"{a}.ppo_mini_batch_size={N // 2}",
            f"{a}.ulysses_sequence_parallel_size={sp}",
            f"{a}.use_dynamic_bsz={str(dynamic).lower()}",
            f"{a}.ppo_max_token_len_per_gpu={budget}",
            f"{a}.ppo_micro_batch_size_per_gpu={m}",
            f"{r}.log_prob_micro_batch_size_per_gpu={m}",
            f"{r}.log_prob_max_token_len_per_gpu={budget}",
            f"{a}.ppo_epochs=2",
            *(["trainer.use_v1=false"] if profile == "engine" else []),  # the live actor gets rows as v0 sends them
        ],
    )


@pytest.mark.parametrize(
    "name,profile,dynamic",
    [("dp2", "engine", False), ("dp2", "engine", True), ("dp2", "legacy", True), ("sp2", "legacy", False)],
)
def test_trace_matches_plan(name, profile, dynamic, ref):
    """compute_log_prob and update_actor (2 mini-batches × 2 epochs) as plan() predicts them: rows, tokens, padded
    tokens, micro-batch count, rows and tokens per micro-batch, mini-batches and collective counts, per rank."""
    data, lp, _, _ = ref
    W, sp = GROUPS[name]
    cfg = _cfg(profile, W, sp, dynamic, 2, 24 // sp)
    s = settings_from_config(cfg, model_config=CFG)
    wg = group(name)
    _set(
        wg,
        rebuild=True,
        **{
            k: getattr(s, k)
            for k in (
                "profile",
                "ppo_mini_batch_size",
                "ppo_micro_batch_size_per_gpu",
                "use_dynamic_bsz",
                "ppo_max_token_len_per_gpu",
                "ppo_epochs",
                "loss_agg_mode",
                "use_remove_padding",
                "log_prob_micro_batch_size_per_gpu",
                "log_prob_use_dynamic_bsz",
                "log_prob_max_token_len_per_gpu",
            )
        },
    )
    wg.reset_trace()
    ar.compute_log_prob(wg, data)
    batch = make_batch()
    batch.batch["old_log_probs"] = lp.clone()
    ar.update_actor(wg, batch)
    _set(wg, rebuild=True)  # the update moved the weights (SGD, lr 1)
    predicted = plan(cfg, data.batch["attention_mask"].sum(-1).tolist())
    fields = ("rows", "tokens", "padded_tokens", "n_micro", "micro_rows", "micro_tokens", "mini_batches", "collectives")
    mismatches = compare(predicted, wg.trace, stages=["old_log_prob", "update_actor"], fields=fields)
    assert mismatches == [], "\n".join(map(str, mismatches))
    live = wg.trace.at("old_log_prob")
    assert all(r.micro_batches for r in live) and len(live) == W
    for stage in ("old_log_prob", "update_actor"):  # and each micro-batch's own collectives (forward, backward)
        per_micro = [r.extra["micro_collectives"] for r in wg.trace.at(stage)]
        assert per_micro == [r.extra["micro_collectives"] for r in predicted.at(stage)]
        assert all(len(m) == r.n_micro for m, r in zip(per_micro, wg.trace.at(stage)))


# ---- bad input ----------------------------------------------------------------------------------------------------
def test_bad_input_raises_verls_error_before_any_rank_waits(ref):
    """E31 (budget below the longest row; legacy: below the padded width), E30 (engine static micro size not dividing
    the rows), E41 (heads not divisible by sp), E21: verl's type and text, on the driver before dispatch; called on
    the ranks directly, E31/E30 still come back at once (the E31 verdicts travel with the first all-reduce), and the
    group stays usable."""
    data = ref[0]
    wg = group("dp2")
    _set(wg, profile="engine", use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=LONGEST - 1)
    e31 = (
        f"max_token_len must be greater than the sequence length. Got max_token_len={LONGEST - 1} and "
        f"max_seq_len=tensor({LONGEST})"
    )
    with pytest.raises(AssertionError) as err:
        ar.compute_log_prob(wg, data)
    assert str(err.value) == e31
    t0 = time.monotonic()
    with pytest.raises(RankError) as err:  # only dp_rank 0 holds the 18-token row
        wg.compute_log_prob(data)
    assert time.monotonic() - t0 < COLL_S and err.value.exc_type == "AssertionError"
    assert err.value.remote_message == e31
    ar.configure(wg, profile="legacy")
    with pytest.raises(
        AssertionError,
        match=r"^max_token_len must be greater than the sequence length\. Got "
        rf"max_token_len={LONGEST - 1} and max_seq_len={P + R}$",
    ):
        ar.compute_log_prob(wg, data)
    ar.configure(
        wg, profile="engine", use_dynamic_bsz=False, log_prob_micro_batch_size_per_gpu=3, ppo_micro_batch_size_per_gpu=3
    )
    e30 = "data size must be divisible by force_group_size * micro_batch_size_per_gpu"
    with pytest.raises(AssertionError, match=f"^{re.escape(e30)}$"):
        ar.compute_log_prob(wg, data)
    batch = make_batch()
    batch.batch["old_log_probs"] = ref[1].clone()
    with pytest.raises(AssertionError, match=f"^{re.escape(e30)}$"):
        ar.update_actor(wg, batch)
    t0 = time.monotonic()
    with pytest.raises(RankError) as err:
        wg.update_actor(batch)
    assert time.monotonic() - t0 < COLL_S and err.value.remote_message == e30
    with pytest.raises(AssertionError, match=r"^Got mini_batch_size=3 and self\.engine\.get_data_parallel_size\(\)=2$"):
        ar.configure(wg, ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=3) and ar.update_actor(wg, batch)
    with pytest.raises(
        AssertionError,
        match=r"^normalized ppo_mini_batch_size 4 should be divisible by "
        r"ppo_micro_batch_size_per_gpu 3$",
    ):
        ar.configure(wg, profile="legacy", ppo_mini_batch_size=N, ppo_micro_batch_size_per_gpu=3)
    ar.configure(
        wg, profile="engine", ppo_mini_batch_size=N, ppo_micro_batch_size_per_gpu=1, log_prob_micro_batch_size_per_gpu=2
    )
    out = ar.compute_log_prob(wg, data)  # still usable: no rank was left waiting
    assert _masked_err(out.batch["old_log_probs"], ref[1], data.batch["response_mask"]) <= LOGPROB_TOL
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"^num_attention_heads 4 must be divisible by ulysses_sp_size 3$"):
        ar.start_actor_group(3, base_settings(sp=3), launcher="local")
    assert time.monotonic() - t0 < 5 and len(live_groups()) == len(_OPEN)


# ---- bf16 ---------------------------------------------------------------------------------------------------------
def test_bf16_drift_between_micro_batch_shapes_is_measured(ref):
    """FSDP2 mixed precision (bf16 compute, fp32 master weights): log-probs of the same rows under different
    micro-batch shapes, measured against each other and against fp32. Only finiteness is asserted; numbers printed."""
    data, lp_ref, _, _ = ref
    mask = data.batch["response_mask"]
    wg = group("dp2")
    _set(wg, param_dtype="bfloat16", profile="legacy")
    runs = {}
    for rmpad in (False, True):
        for m in (1, 4):
            ar.configure(wg, use_remove_padding=rmpad, log_prob_micro_batch_size_per_gpu=m)
            runs[f"{'rmpad' if rmpad else 'padded'} m={m}"] = ar.compute_log_prob(wg, data).batch["old_log_probs"]
    ar.configure(wg, log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=LONGEST)
    runs["rmpad dynamic 18"] = ar.compute_log_prob(wg, data).batch["old_log_probs"]
    _set(wg)
    names = list(runs)
    base = runs[names[0]]
    lines = [
        f"{k}: vs '{names[0]}' {_masked_err(v, base, mask):.3e}, vs fp32 {_masked_err(v, lp_ref, mask):.3e}"
        for k, v in runs.items()
    ]
    pair = max(_masked_err(runs[a], runs[b], mask) for a in names for b in names)
    lines.append(f"largest drift between any two micro-batch shapes: {pair:.3e}")
    print("\nbf16 log-prob drift (max |Δ| over response tokens):\n  " + "\n  ".join(lines))
    assert all(torch.isfinite(v[mask.bool()]).all() for v in runs.values())
    assert all(_masked_err(v, lp_ref, mask) > 0 for v in runs.values())  # bf16 really ran
