"""labkit's hang prediction before any run: (a) counts that differ without the MAX sync, (b) a light rank below the
synced count, (c) split(0); with the lengths that trigger each, or the probability over a drawn length profile."""

from __future__ import annotations

import random

from labkit.balance.micro_batches import plan_dp_micro_batches
from labkit.cli import main
from labkit.config.keys import ARR
from labkit.hangs.reproduce import BUDGET, HEAVY, LIGHT, dynamic_config
from labkit.plan.hang_risk import config_risks, rank_risks, unsynced_counts


def test_unsynced_counts_are_what_each_rank_computes_alone():
    """k = min(rows, ceil(tokens / budget)) per rank, and the synced count is their MAX (random layouts)."""
    rng = random.Random(3)
    for _ in range(200):
        per_rank = [[rng.randint(1, 900) for _ in range(rng.randint(1, 9))] for _ in range(rng.randint(2, 4))]
        budget = rng.randint(900, 3000)
        alone = unsynced_counts(per_rank, budget, "legacy", None)
        assert alone == [min(len(r), -(-sum(r) // budget)) for r in per_rank]
        if all(len(r) >= max(alone) for r in per_rank):
            synced = plan_dp_micro_batches(per_rank, budget, profile="legacy")
            assert [p.num_micro_batches for p in synced] == [max(alone)] * len(per_rank)


def test_rank_risks_name_a_and_b_with_the_counts_that_trigger_them():
    (a,) = rank_risks([HEAVY, LIGHT], BUDGET, "old_log_prob")
    assert (a.kind, a.counts, a.rows) == ("a", [3, 1], [4, 4])
    kinds = {r.kind: r for r in rank_risks([HEAVY, LIGHT[:2]], BUDGET, "old_log_prob")}
    assert set(kinds) == {"a", "b"} and kinds["b"].counts == [3, 3] and kinds["b"].rows == [4, 2]
    assert "dp_rank(s) [1] hold [2] rows" in kinds["b"].trigger
    # engine: the count is always MAX-synced over the DP group it passes (no (a)) and the group count is synced too,
    # so every rank raises E35 together (no (b)): an error, not a hang
    assert rank_risks([HEAVY, LIGHT[:2]], BUDGET, "old_log_prob", "engine") == []
    assert rank_risks([HEAVY, HEAVY], BUDGET, "old_log_prob") == []


def test_config_risks_with_lengths_and_with_a_profile():
    cfg = dynamic_config()  # balance off: dp_rank 0 gets the first 4 samples
    (a,) = config_risks(cfg, HEAVY + LIGHT)
    assert (a.kind, a.stage, a.counts, a.probability) == ("a", "old_log_prob", [3, 1], None)
    assert config_risks(cfg, HEAVY[:2] + LIGHT[:2] + HEAVY[:2] + LIGHT[:2]) == []  # same tokens per rank
    balanced = dynamic_config("legacy", BUDGET, "trainer.balance_batch=true")
    risks = config_risks(balanced, "long-reasoning", draws=50)
    assert [r.kind for r in risks] == ["a"] and 0 < risks[0].probability < 1  # some draws only
    assert config_risks(dynamic_config("legacy", 8192, "trainer.balance_batch=true"), "long-reasoning", draws=50) == []


def test_config_risks_c_needs_no_lengths():
    cfg = dynamic_config(
        "legacy",
        BUDGET,
        f"{ARR}.rollout.log_prob_use_dynamic_bsz=false",
        f"{ARR}.rollout.log_prob_micro_batch_size=1",
        f"~{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
    )
    (c,) = config_risks(cfg, None)
    assert (c.kind, c.stage) == ("c", "old_log_prob") and "#12" in c.trigger
    tiny_mini = dynamic_config("legacy", BUDGET, f"{ARR}.actor.ppo_mini_batch_size=1", f"{ARR}.rollout.n=1")
    assert [(r.kind, r.stage) for r in config_risks(tiny_mini, None)] == [("c", "update_actor")]  # E20: M′ = 1 // 2
    assert config_risks(dynamic_config(), None) == []


def test_labkit_check_prints_the_hang_warnings(capsys):
    base = [
        "trainer.n_gpus_per_node=2",
        "algorithm.adv_estimator=grpo",
        "trainer.balance_batch=false",
        "data.train_batch_size=4",
        f"{ARR}.rollout.n=2",
        "data.max_prompt_length=1024",
        "data.max_response_length=3072",
        f"{ARR}.actor.ppo_mini_batch_size=4",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
        f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=2",
    ]
    dyn = [
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"{ARR}.rollout.log_prob_use_dynamic_bsz=true",
        f"{ARR}.rollout.log_prob_max_token_len_per_gpu=4096",
    ]
    lengths = ",".join(map(str, HEAVY + LIGHT))
    assert main(["check", *base, *dyn, "--profile", "legacy", "--lengths", lengths]) == 0
    out = capsys.readouterr().out
    assert "warning: hang (a) at old_log_prob" in out and "k per DP rank [3, 1]" in out
    assert main(["check", *base, f"{ARR}.rollout.log_prob_micro_batch_size=1", "--profile", "legacy"]) == 1
    assert "warning: hang (c) at old_log_prob" in capsys.readouterr().out
    assert main(["check", *base, *dyn, "--profile", "legacy"]) == 0  # no lengths: nothing to warn about
    assert "warning" not in capsys.readouterr().out


def test_check_warns_only_of_the_hangs_of_the_profile_it_checks_and_answers_fast():
    """An engine verdict printed 0.7.1-only (a) warnings and took 20 s on an 8-GPU 7B config with 8k responses:
    the engine syncs the count over its DP group, so it draws nothing; legacy draws within its time budget."""
    import contextlib
    import io
    import time

    from labkit.cli import main

    argv = [
        "check",
        "trainer.n_gpus_per_node=8",
        "data.train_batch_size=1024",
        "actor_rollout_ref.rollout.n=5",
        "data.max_response_length=8192",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "algorithm.adv_estimator=grpo",
        "--lengths",
        "long-reasoning",
    ]
    for profile, bound in (("engine", 2.0), ("legacy", 4.0)):
        out = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(out):
            main([*argv, "--profile", profile])
        took = time.perf_counter() - start
        warned = "hang (a)" in out.getvalue()
        assert took < bound and warned == (profile == "legacy"), (profile, took, out.getvalue()[-600:])
