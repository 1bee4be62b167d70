"""labkit.validate.report: verl's batch-size checks, their order, arithmetic, fixes and speed.

Worked examples are the config of docs/pipeline.md (B=60, n=12, W=6, tp=2, M=60, m=8) and common claims about
it that verl's code contradicts (the test_A* functions: the start-up check is on B x n, not B; the mini-batch size
matters; rollout.n=13; *_per_gpu keys are never divided; when E20 fires; W=5 with TP=2); every expected message is
verl's exact text. Random configs (the parity module's generator) check invariants: fixes fix, first_error is the first
error in order, raise_for raises it.
"""

from __future__ import annotations

import random
import statistics
import time

import pytest

from labkit.config.verl_config import SEED_EXAMPLE, load_config
from labkit.validate.batch_sizes import dp_size, mini_batch_arithmetic, normalized_mini, rows_per_rank
from labkit.validate.report import (
    Report,
    VerlAssertionError,
    VerlCheckError,
    VerlValueError,
    check,
    raise_for,
)

ACT, RO, REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
PROFILES = ("legacy", "engine")


def cfg_of(*overrides: str, profile: str = "legacy", base=SEED_EXAMPLE):
    """A config; engine ones follow the v0 loop (trainer.use_v1=false) unless the overrides set the flag."""
    overrides = list(base) + list(overrides)
    if profile == "engine" and not any(o.startswith("trainer.use_v1=") for o in overrides):
        overrides.append("trainer.use_v1=false")
    return load_config(overrides=overrides, profile=profile)


def first_startup(report: Report):
    return next((f for f in report.errors if f.when == "start-up"), None)


# -- the worked example -------------------------------------------------------------------------------------------
def test_seed_example_passes_with_the_posts_arithmetic_legacy():
    r = check(cfg_of())
    assert r.ok and r.first_error is None and not r.silent, str(r)
    lines = r.arithmetic()
    assert "M' = (60 x 12) // (6 // 1) = 120" in lines
    assert "120 % 8 = 0" in r.arithmetic("E21")
    assert "GA = 120 // 8 = 15" in r.arithmetic("GA")
    assert "old_log_prob: 120 rows / 8 per micro-batch = 15 micro-batches of 8" in lines
    assert "real_train_batch_size = B x n = 60 x 12 = 720" in lines
    assert normalized_mini(cfg_of()) == 120 and rows_per_rank(cfg_of()) == 120 and dp_size(cfg_of()) == 6
    assert mini_batch_arithmetic(cfg_of()) == "M' = (60 x 12) // (6 // 1) = 120"
    assert "passes start-up, worker init and step 1" in str(r)


def test_seed_example_passes_engine_with_the_same_numbers():
    r = check(cfg_of(profile="engine"))
    assert r.ok and not r.silent, str(r)
    lines = r.arithmetic()
    assert "mini per rank = 720 / 6 = 120" in lines and "GA = 120 // 8 = 15" in lines
    assert "old_log_prob: 120 rows / 8 per micro-batch = 15 micro-batches of 8" in lines
    assert normalized_mini(cfg_of(profile="engine")) == 120


# -- claims verl's code contradicts --------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", PROFILES)
def test_A2_the_check_is_on_B_times_n_not_B(profile):
    base = [
        "trainer.n_gpus_per_node=6",
        f"{ACT}.ppo_micro_batch_size_per_gpu=1",
        f"{RO}.log_prob_micro_batch_size_per_gpu=1",
        "algorithm.adv_estimator=grpo",
    ]
    ok = check(
        cfg_of("data.train_batch_size=3", f"{RO}.n=2", f"{ACT}.ppo_mini_batch_size=3", base=base, profile=profile)
    )
    assert first_startup(ok) is None  # B=3 is not a multiple of 6 GPUs, B x n = 6 is
    bad = check(
        cfg_of("data.train_batch_size=7", f"{RO}.n=1", f"{ACT}.ppo_mini_batch_size=7", base=base, profile=profile)
    )
    f = bad.first_error
    assert (f.code, f.exc_type, f.when) == ("E1", "AssertionError", "start-up")
    assert f.message == "real_train_batch_size (7) must be divisible by minimal possible batch size (6)"
    assert f.arithmetic[-1] == "7 % 6 != 0"
    dyn = check(
        cfg_of("data.train_batch_size=7", f"{RO}.n=1", f"{ACT}.use_dynamic_bsz=true", base=base, profile=profile)
    )
    assert first_startup(dyn) is None and "E1" not in [c.code for c in dyn.checks]  # E1 skipped when dynamic
    assert dyn.first_error.when == "step 1"  # ... but the step still needs B x n divisible (agent split / E38)


def test_A10_mini_batch_size_matters_legacy_floors_silently_engine_asserts():
    legacy = check(cfg_of(f"{ACT}.ppo_mini_batch_size=25", f"{ACT}.ppo_micro_batch_size_per_gpu=10"))
    assert legacy.ok
    s1 = next(f for f in legacy.silent if f.code == "S1")
    assert s1.message == "actor update: 120 rows per rank split into mini-batches 2 x 50 + 1 x 20 (last one ragged)"
    assert "mini-batches per epoch = ceil(120 / 50) = 3" in s1.arithmetic  # 3 optimizer steps, not 1
    s2 = next(f for f in legacy.silent if f.code == "S2")
    assert "last mini-batch weight = 2/5 of a full one" in s2.arithmetic
    engine = check(cfg_of(f"{ACT}.ppo_mini_batch_size=25", f"{ACT}.ppo_micro_batch_size_per_gpu=10", profile="engine"))
    f = engine.first_error
    assert (f.code, f.message, f.when) == ("E29", "120 % 50 != 0", "step 1")
    # (M x n) % D != 0: legacy floors (M' = 1) without a word, the engine raises E28
    args = [
        "data.train_batch_size=64",
        f"{RO}.n=1",
        "trainer.n_gpus_per_node=8",
        f"{ACT}.ppo_mini_batch_size=12",
        f"{ACT}.ppo_micro_batch_size_per_gpu=1",
        f"{RO}.log_prob_micro_batch_size_per_gpu=1",
    ]
    legacy = check(cfg_of(*args))
    assert legacy.ok and "M' = (12 x 1) // (8 // 1) = 1" in legacy.arithmetic()
    f = check(cfg_of(*args, profile="engine")).first_error
    assert (f.code, f.message) == ("E28", "Got mini_batch_size=12 and self.engine.get_data_parallel_size()=8")


@pytest.mark.parametrize("profile", PROFILES)
def test_A11_rollout_n_13_on_6_gpus(profile):
    r = check(cfg_of(f"{RO}.n=13", profile=profile))
    assert first_startup(r) is None  # 780 = 6 x 130: validate_config passes
    assert "real_train_batch_size = B x n = 60 x 13 = 780" in r.arithmetic("E1")
    r10 = check(cfg_of(f"{RO}.n=13", f"{ACT}.ppo_micro_batch_size_per_gpu=10", profile=profile))
    f = r10.first_error
    assert (f.code, f.when, f.exc_type) == ("E26", "step 1", "AssertionError")
    assert f.message == "only support equal chunk. Got size of DataProto 780 and chunk 8."
    no_micro = check(cfg_of(f"~{ACT}.ppo_micro_batch_size_per_gpu", profile=profile)).first_error
    assert (no_micro.code, no_micro.exc_type, no_micro.when) == ("E7", "AssertionError", "start-up")
    assert no_micro.message == (
        "[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
        "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled."
    )


def test_A11_legacy_worker_fails_E21_with_m_8():
    f = check(cfg_of(f"{RO}.n=13")).first_error
    assert (f.code, f.when, f.exc_type) == ("E21", "worker init", "AssertionError")
    assert f.message == "normalized ppo_mini_batch_size 130 should be divisible by ppo_micro_batch_size_per_gpu 8"
    assert f.arithmetic == ["M' = (60 x 13) // (6 // 1) = 130", "130 % 8 != 0"]
    assert f.where == "verl/workers/fsdp_workers.py: ActorRolloutRefWorker.__init__"
    assert [e.code for e in check(cfg_of(f"{RO}.n=13")).errors] == ["E21", "E26"]  # E26 waits behind it


def test_A12_per_gpu_log_prob_micro_is_never_divided():
    lines = check(cfg_of()).arithmetic()
    assert "old_log_prob: 120 rows / 8 per micro-batch = 15 micro-batches of 8" in lines
    deprecated = check(cfg_of(f"~{RO}.log_prob_micro_batch_size_per_gpu", f"{RO}.log_prob_micro_batch_size=8"))
    assert deprecated.ok
    s4 = next(f for f in deprecated.silent if f.code == "S4")
    assert s4.arithmetic == ["8 // (6 // 1) = 1"]  # only the deprecated global key is floor-divided
    assert "old_log_prob: 120 rows / 1 per micro-batch = 120 micro-batches of 1" in deprecated.arithmetic()
    engine = check(
        cfg_of(f"~{RO}.log_prob_micro_batch_size_per_gpu", f"{RO}.log_prob_micro_batch_size=8", profile="engine")
    ).first_error
    assert (engine.code, engine.when, engine.message) == ("B2", "worker init", "")  # bare assert, unusable key


@pytest.mark.parametrize(
    "M,n,W,sp,fires",
    [
        (4, 1, 8, 1, True),
        (4, 2, 8, 1, False),
        (4, 1, 8, 2, False),
        (1, 7, 8, 1, True),
        (1, 8, 8, 1, False),
        (3, 2, 8, 4, False),
    ],
)
def test_A25_E20_fires_exactly_when_M_times_n_below_W_over_sp(M, n, W, sp, fires):
    c = cfg_of(
        f"data.train_batch_size={W}",
        f"{RO}.n={n}",
        f"trainer.n_gpus_per_node={W}",
        f"{ACT}.ppo_mini_batch_size={M}",
        f"{ACT}.ulysses_sequence_parallel_size={sp}",
        f"~{ACT}.ppo_micro_batch_size_per_gpu",
        f"{ACT}.use_dynamic_bsz=true",
    )
    e20 = next(f for f in check(c).checks if f.code == "E20")
    assert (e20.severity == "error") == fires == (M * n < W // sp)
    assert e20.arithmetic == [f"M' = ({M} x {n}) // ({W} // {sp}) = {M * n // (W // sp)}"]
    if fires:
        assert e20.message == "ppo_mini_batch_size 0 should be larger than 0 after normalization"
        assert e20.when == "worker init" and e20.exc_type == "AssertionError"


@pytest.mark.parametrize("profile", PROFILES)
def test_A27_five_gpus_with_tp_2_is_a_hard_assert(profile):
    f = check(cfg_of("trainer.n_gpus_per_node=5", profile=profile)).first_error
    assert (f.code, f.when, f.exc_type) == ("E23", "worker init", "AssertionError")
    assert f.message == "rollout world_size: 5 is not divisible by infer_world_size: 2"
    assert f.arithmetic[-1] == "5 % 2 != 0"


# -- arithmetic style, when/where, order ---------------------------------------------------------------------------
def test_failure_arithmetic_in_the_floor_division_style():
    c = cfg_of(
        f"{RO}.n=1",
        "trainer.n_gpus_per_node=8",
        f"{ACT}.ulysses_sequence_parallel_size=2",
        f"{ACT}.ppo_micro_batch_size_per_gpu=4",
        f"{ACT}.use_dynamic_bsz=true",
    )
    e21 = next(f for f in check(c).errors if f.code == "E21")  # checked even with dynamic batch size
    assert e21.arithmetic == ["M' = (60 x 1) // (8 // 2) = 15", "15 % 4 != 0"]


@pytest.mark.parametrize(
    "overrides,code,when",
    [
        ([f"{ACT}.loss_agg_mode=token-sum"], "E8", "start-up"),
        ([f"{ACT}.ppo_mini_batch_size=61"], "E9", "start-up"),
        ([f"{RO}.mode=sync"], "E25", "worker init"),
        (
            [
                f"{ACT}.use_dynamic_bsz=true",
                f"~{ACT}.ppo_micro_batch_size_per_gpu",
                "data.train_batch_size=61",
                f"{RO}.n=1",
                f"{RO}.agent.num_workers=1",
            ],
            "E38",
            "step 1",
        ),
        ([f"{ACT}.use_dynamic_bsz=true", f"{ACT}.ppo_max_token_len_per_gpu=512"], "E31", "step 1"),
    ],
)
def test_when_and_exception_type(overrides, code, when):
    f = check(cfg_of(*overrides)).first_error
    assert (f.code, f.when) == (code, when), str(check(cfg_of(*overrides)))
    assert f.exc_type == ("ValueError" if code in ("E8", "E9", "E25") else "AssertionError")


def test_legacy_E31_uses_the_padded_width_engine_the_longest_row():
    c = [
        "data.max_prompt_length=512",
        "data.max_response_length=1024",
        f"{ACT}.use_dynamic_bsz=true",
        f"{ACT}.ppo_max_token_len_per_gpu=1200",
    ]
    f = check(cfg_of(*c)).first_error
    assert f.message == (
        "max_token_len must be greater than the sequence length. Got max_token_len=1200 and max_seq_len=1536"
    )
    engine = check(cfg_of(*c, profile="engine"))
    cond = [f for f in engine.findings if f.code == "E31"]
    assert engine.ok and cond and all(f.severity == "notice" for f in cond)  # only if a row is that long
    assert cond[0].fixes == ["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=1536"]
    definite = check(cfg_of(*c, profile="engine"), max_seq_len=1300).first_error
    assert definite.message.endswith("Got max_token_len=1200 and max_seq_len=tensor(1300)")
    assert check(cfg_of(*c, profile="engine"), max_seq_len=1100).ok


def test_ulysses_head_asserts_with_head_counts():
    c = cfg_of(f"{ACT}.ulysses_sequence_parallel_size=2")
    assert check(c, 14, 2).ok
    f = check(c, 15, 2).first_error
    assert (f.code, f.when, f.message) == (
        "E41",
        "worker init",
        "num_attention_heads 15 must be divisible by ulysses_sp_size 2",
    )
    c4 = cfg_of(
        "trainer.n_gpus_per_node=4",
        "data.train_batch_size=64",
        f"{ACT}.ppo_mini_batch_size=64",
        f"{ACT}.ulysses_sequence_parallel_size=4",
    )
    assert check(c4, 16, 2).ok  # kv 2 < sp 4: heads repeated
    f = check(c4, 16, 6).first_error
    assert f.code == "E42" and f.message == (
        "num_key_value_heads 6 must be divisible by ulysses_sp_size 4or vise versa. Upon ulysses_sp_size % "
        "num_key_value_heads == 0,kv heads are repeated to ensure correctness."
    )
    assert "ulysses_sequence_parallel_size=2" in f.fixes[0]


def test_worker_init_order_legacy_actor_then_critic_then_rollout():
    c = cfg_of(
        f"{RO}.n=13",
        "algorithm.adv_estimator=gae",
        "critic.ppo_micro_batch_size_per_gpu=7",
        f"{RO}.mode=sync",
        "trainer.n_gpus_per_node=6",
    )
    init = [(f.code, f._role) for f in check(c).errors if f.when == "worker init"]
    assert init == [("E21", "actor"), ("E21", "critic"), ("E25", "rollout")]


def test_engine_worker_init_order_ref_then_actor_then_rollout():
    c = cfg_of(
        f"{ACT}.use_kl_loss=true",
        f"{ACT}.use_dynamic_bsz=true",
        f"{RO}.log_prob_use_dynamic_bsz=false",
        f"{REF}.log_prob_use_dynamic_bsz=false",
        f"~{REF}.log_prob_micro_batch_size_per_gpu",
        "trainer.n_gpus_per_node=5",
        profile="engine",
    )
    errs = [(f.code, f.when) for f in check(c).errors]
    assert errs[:3] == [("E7", "worker init"), ("B1", "worker init"), ("E23", "worker init")]


def test_critic_quirk_E14_and_E22_for_the_critic():
    f = check(cfg_of("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size=4")).first_error
    assert f.code == "E14" and f.message.startswith("[critic] You have set both 'critic.micro_batch_size' AND")
    c = cfg_of(
        "algorithm.adv_estimator=gae",
        "critic.ppo_micro_batch_size_per_gpu=1",
        "critic.ppo_mini_batch_size=1",
        "trainer.n_gpus_per_node=8",
        f"{RO}.n=4",
        "data.train_batch_size=64",
        f"{ACT}.ppo_mini_batch_size=64",
    )
    f = check(c).first_error  # the critic has no E20: a zero normalised mini surfaces as E22
    assert (f.code, f._role, f.message) == (
        "E22",
        "critic",
        "normalized ppo_mini_batch_size 0 should be larger than ppo_micro_batch_size_per_gpu 1",
    )


def test_notices_are_not_errors():
    r = check(cfg_of(f"{ACT}.use_kl_loss=true", "algorithm.use_kl_in_reward=true", "data.val_batch_size=4"))
    assert r.ok and [f.message[:7] for f in r.notices][:2] == ["NOTICE:", "WARNING"]


@pytest.mark.parametrize("profile", PROFILES)
def test_snapshot_reads_the_profiles_defaults(profile):
    """Every value the rules read equals cfg.get (profile defaults included: critic rmpad is false in 0.7.1)."""
    from labkit.validate.snapshot import _SNAP_KEYS, Snap

    for cfg in (load_config(profile=profile), cfg_of(profile=profile)):
        s = Snap(cfg)
        assert {n: getattr(s, n) for n in _SNAP_KEYS} == {n: cfg.get(p) for n, p in _SNAP_KEYS.items()}
    legacy_sp2 = cfg_of(
        "algorithm.adv_estimator=gae",
        "critic.ulysses_sequence_parallel_size=2",
        "critic.ppo_micro_batch_size_per_gpu=4",
        profile=profile,
    )
    f = check(legacy_sp2, fixes=False).first_error
    if profile == "legacy":  # verl 0.7.1 FSDPCriticConfig.__post_init__, critic.model.use_remove_padding: false
        assert (f.code, f.exc_type, f.when) == ("E18", "ValueError", "start-up")
    else:  # 0.9.1 dropped E18 and its YAML default is true
        assert f is None or f.code != "E18"


# -- raise_for ----------------------------------------------------------------------------------------------------
def test_raise_for_raises_verls_exception_type_and_text():
    assert raise_for(cfg_of()) is None
    with pytest.raises(AssertionError) as exc:
        raise_for(cfg_of(f"{RO}.n=13"))
    assert isinstance(exc.value, VerlAssertionError) and isinstance(exc.value, VerlCheckError)
    assert str(exc.value) == "normalized ppo_mini_batch_size 130 should be divisible by ppo_micro_batch_size_per_gpu 8"
    assert exc.value.finding.code == "E21" and exc.value.exc_type == "AssertionError"
    with pytest.raises(ValueError) as exc:
        raise_for(cfg_of(f"{ACT}.ppo_mini_batch_size=61"))
    assert isinstance(exc.value, VerlValueError)
    assert str(exc.value) == "train_batch_size (60) must be >= actor.ppo_mini_batch_size (61)"


# -- invariants on random configs ---------------------------------------------------------------------------------
def _random_configs(k: int):
    from test_validate_parity import random_config

    rng = random.Random(7)
    return [random_config(rng, PROFILES[i % 2]) for i in range(k)]


def test_fixes_really_fix_the_whole_config():
    """Every suggested fix, applied as overrides, leaves no error and clears its finding; few-error configs
    always get one. (The random configs are far denser in errors than real ones: 4 errors and more are common.)"""
    tried, with_fix = 0, {"few": [0, 0], "many": [0, 0]}
    for cfg in _random_configs(120):
        r = check(cfg)
        assert r.first_error is (r.errors[0] if r.errors else None)
        bucket = with_fix["few" if len(r.errors) <= 2 else "many"]
        for f in r.findings:
            if f.severity == "error":
                bucket[0] += 1
                bucket[1] += bool(f.fixes)
            for fix in f.fixes:
                tried += 1
                after = check(cfg.copy().override(fix.split()), fixes=False)
                assert after.ok, (fix, f.code, str(after))
                assert not any(g.code == f.code and g._role == f._role for g in after.findings), (fix, f.code)
    few, many = with_fix["few"], with_fix["many"]
    assert tried >= 300 and few[0] >= 20 and few[1] == few[0] and many[1] >= 0.7 * many[0], (tried, with_fix)


def test_first_error_is_what_raise_for_raises():
    for cfg in _random_configs(60):
        first = check(cfg, fixes=False).first_error
        if first is None:
            assert raise_for(cfg) is None
            continue
        with pytest.raises(VerlCheckError) as exc:
            raise_for(cfg)
        assert str(exc.value) == first.message and exc.value.exc_type == first.exc_type


def test_report_str_is_a_readable_verdict():
    text = str(check(cfg_of(f"{RO}.n=13")))
    assert text.splitlines()[0].startswith("verl legacy: FAILS at worker init - AssertionError: normalized")
    assert "| 130 % 8 != 0" in text and "fix: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10" in text


# -- speed: the widget calls check() on every slider move ---------------------------------------------------------
def test_check_is_fast_on_slider_moves():
    sliders = {
        "data.train_batch_size": range(8, 129, 8),
        f"{RO}.n": range(1, 17),
        f"{ACT}.ppo_mini_batch_size": range(4, 61, 4),
        f"{ACT}.ppo_micro_batch_size_per_gpu": range(1, 17),
        "trainer.n_gpus_per_node": range(1, 9),
    }
    times = []
    for profile in PROFILES:
        base = cfg_of(profile=profile)
        for key, values in sliders.items():
            for v in values:
                c = base.copy().set(key, v)
                t0 = time.perf_counter()
                check(c)
                times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.005, f"median {statistics.median(times) * 1e3:.2f} ms"


# -- 0.9.1's default v1 loop: verl's padding log line (N6) and the ignored balance flag (S5) ------------------------
def test_v1_padding_notice_pads_as_verls_own_required_multiple():
    """Engine + trainer.use_v1 (0.9.1's default): N6 is verl's log line with the lcm and pad that verl 0.9.1's own
    PPOTrainer._get_required_batch_multiple (compiled from trainer/ppo/v1/trainer_base.py) and
    upsample_batch_to_divisible_size give; no N6 with use_v1=false, with nothing to pad, or in legacy."""
    import math
    import types
    from pathlib import Path

    import verl
    from _oracle_legacy import load_function
    from omegaconf import OmegaConf

    src = Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
    required = load_function(src, "_get_required_batch_multiple", {"math": math}, cls="PPOTrainer")
    rng = random.Random("v1")
    fired = 0
    for _ in range(150):
        B, n, gpn = rng.randint(1, 40), rng.choice([1, 2, 3, 4, 5, 8]), rng.choice([1, 2, 3, 4, 6, 8])
        M, cM, warm = rng.randint(1, B), rng.randint(1, B), rng.choice([0, 0, 0, 3])
        adv = rng.choice(["gae", "grpo"])
        cfg = cfg_of(
            f"data.train_batch_size={B}",
            f"actor_rollout_ref.rollout.n={n}",
            f"trainer.n_gpus_per_node={gpn}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={M}",
            f"critic.ppo_mini_batch_size={cM}",
            f"trainer.critic_warmup={warm}",
            f"algorithm.adv_estimator={adv}",
            "trainer.use_v1=true",
            profile="engine",
        )
        stub = types.SimpleNamespace(
            use_critic=cfg.need_critic,
            global_steps=1,
            config=OmegaConf.create(
                {
                    "critic": {"ppo_mini_batch_size": cM},
                    "trainer": {"critic_warmup": warm},
                    "actor_rollout_ref": {"rollout": {"n": n}, "actor": {"ppo_mini_batch_size": M}},
                }
            ),
        )
        multiple = required(stub, gpn)  # sp = 1: dp_size = W
        pad = multiple - (B * n) % multiple if (B * n) % multiple else 0  # upsample_batch_to_divisible_size
        notes = [f for f in check(cfg, fixes=False).findings if f.code == "N6"]
        if pad == 0:
            assert not notes
            continue
        fired += 1
        assert len(notes) == 1 and notes[0].severity == "notice"
        assert notes[0].message == (
            f"Upsampled batch from {B * n} to {B * n + pad} with {pad} synthetic padding samples "
            f"for required_multiple={multiple}"
        )
        off = cfg.copy().override(["trainer.use_v1=false"])
        assert not [f for f in check(off, fixes=False).findings if f.code in ("N6", "S5")]
    assert fired > 30
    unbalanced = cfg_of(
        "data.train_batch_size=8",
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.rollout.n=1",
        "trainer.balance_batch=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "critic.ppo_mini_batch_size=8",
        "trainer.use_v1=true",
        profile="engine",
    )  # nothing to pad, but v1 balances anyway
    codes = [f.code for f in check(unbalanced, fixes=False).findings]
    assert "S5" in codes and "N6" not in codes
    legacy = cfg_of(
        "data.train_batch_size=6", "trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.n=1", profile="legacy"
    )
    assert not [f for f in check(legacy, fixes=False).findings if f.code in ("N6", "S5", "N7")]


def test_nccl_timeout_is_named_as_never_read_under_engine_workers():
    base = ["actor_rollout_ref.nccl_timeout=3600", "critic.nccl_timeout=1200"]
    engine = [f for f in check(load_config(overrides=base), fixes=False).findings if f.code == "S7"]
    assert engine and engine[0].severity == "silent"
    assert "actor_rollout_ref.nccl_timeout, critic.nccl_timeout is never read" in engine[0].message
    legacy = check(load_config(overrides=base, profile="legacy"), fixes=False).findings
    assert not [f for f in legacy if f.code == "S7"]  # 0.7.1's workers pass it to init_process_group
    assert not [f for f in check(load_config(), fixes=False).findings if f.code == "S7"]


def test_gradient_checkpointing_is_named_as_unread_under_megatron():
    over = ["model_engine=megatron", "actor_rollout_ref.model.enable_gradient_checkpointing=true"]
    found = [f for f in check(load_config(overrides=over), fixes=False).findings if f.code == "S8"]
    assert found and found[0].severity == "silent"
    fsdp = ["actor_rollout_ref.model.enable_gradient_checkpointing=true"]
    assert not [f for f in check(load_config(overrides=fsdp), fixes=False).findings if f.code == "S8"]
