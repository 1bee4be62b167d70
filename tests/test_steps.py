"""verl past step 1: ``trainer.critic_warmup`` (the first actor update, and v1's padding multiple with it), failed
agent-loop sessions, the completion order from the command line, and the fidelity gaps found on the way (the
deprecated global log-prob micro size, the model a plan's engine rows are about). verl's own functions check the
same rules on random cases in tests/test_v1_oracle.py."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from labkit.cli import main
from labkit.config.verl_config import load_config
from labkit.plan.step import plan
from labkit.validate.report import check

ARR = "actor_rollout_ref"
A = [
    "data.train_batch_size=6",
    f"{ARR}.rollout.n=1",
    "trainer.n_gpus_per_node=2",
    f"{ARR}.actor.ppo_mini_batch_size=4",
    "trainer.critic_warmup=5",
    "trainer.nnodes=1",
    f"{ARR}.rollout.tensor_model_parallel_size=1",
    "critic.enable=false",
    "algorithm.adv_estimator=grpo",
    f"{ARR}.actor.use_dynamic_bsz=true",
]
B = [o.replace("n_gpus_per_node=2", "n_gpus_per_node=4").replace("mini_batch_size=4", "mini_batch_size=6") for o in A]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_no_false_error_before_the_first_actor_update():
    """Steps 1-4 pad 6 rows to 6 (multiple D = 2) and skip the update; from step 5 the multiple is lcm(2, 4) = 4:
    8 rows, two mini-batches of 2 per rank. verl raises nothing at any step."""
    cfg = load_config(overrides=A)
    assert check(cfg).first_error is None
    early, late = plan(cfg, "gsm8k-like", global_step=4), plan(cfg, "gsm8k-like", global_step=5)
    assert early.summary["stage_errors"] == {} and late.summary["stage_errors"] == {}
    assert (early.summary["samples"], late.summary["samples"]) == (6, 8)
    assert early.at("update_actor") == [] and "not run" in early.stage("update_actor").formula
    assert late.summary["mini_batches"] == [2, 2]
    assert run("check", *A)[0] == 0


def test_an_error_of_the_first_update_is_reported_at_its_step():
    cfg = load_config(overrides=B)
    first = check(cfg).first_error
    assert (first.code, first.when) == ("E28", "step 5")
    assert check(cfg, global_step=4).first_error is None  # verl has not reached it by step 4
    assert plan(cfg, global_step=4).summary["stage_errors"] == {}
    assert plan(cfg, global_step=5).summary["stage_errors"]["update_actor"]["code"] == "E28"
    code, out, _ = run("check", *B)
    assert code == 1 and "when:  step 5" in out
    assert run("check", *B, "--step", "4")[0] == 0


def test_failed_sessions_keep_their_groups_survivors_and_none_left_is_e49():
    cfg = load_config(overrides=B)
    tr = plan(cfg, "gsm8k-like", failed_sessions=[1, 2])  # step 1: multiple D = 4
    assert tr.summary["samples"] == 4 and tr.stage("replay_buffer").global_rows == 4
    gone = plan(cfg, "gsm8k-like", failed_sessions=range(6))
    assert gone.summary["stage_errors"]["replay_buffer"]["code"] == "E49"
    assert gone.stage_names()[-1] == "replay_buffer"
    code, out, _ = run("plan", *B, "--failed-sessions", "0,1,2,3,4,5", "--json")
    assert code == 0 and '"E49"' in out
    with pytest.raises(ValueError, match="v1 loop"):
        plan(load_config(overrides=[*B, "trainer.use_v1=false"]), failed_sessions=[0])


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--failed-sessions", "9", "indices must be distinct and in 0..5"),
        ("--failed-sessions", "rate=2", "rate=R takes a number from 0 to 1"),
        ("--failed-sessions", "a,b", "expected comma-separated trajectory indices"),
        ("--completion-order", "0,1", "must list each of the 6 surviving trajectories"),
        ("--completion-order", "random:x", "random:SEED takes a seed"),
        ("--step", "0", "--step must be a global step from 1"),
    ],
)
def test_session_options_are_read_once_with_one_line_errors(option, value, says):
    code, _, err = run("plan", *B, option, value)
    assert code == 2 and says in err and err.count("\n") == 1, err


def test_completion_order_from_the_command_line_is_the_python_apis():
    """The CLI's order reaches the planner as the API's does: the same rows and tokens per rank after balancing."""

    def balanced(argv_order: str) -> list:
        code, out, _ = run("plan", *B, "--lengths", "gsm8k-like", "--completion-order", argv_order, "--json")
        assert code == 0
        ranks = json.loads(out)["ranks"]
        return [(r["rank"], r["rows"], r["tokens"]) for r in ranks if r["stage"] == "balance"]

    api = plan(load_config(overrides=B), "gsm8k-like", completion_order=[5, 4, 3, 2, 1, 0])
    assert balanced("5,4,3,2,1,0") == [(r.rank, r.rows, r.tokens) for r in api.at("balance")]
    assert balanced("random:3") == balanced("random:3")  # a seed is a seed
    assert balanced("submission") == [
        (r.rank, r.rows, r.tokens) for r in plan(load_config(overrides=B), "gsm8k-like").at("balance")
    ]


@pytest.mark.parametrize("profile", ["legacy", "engine"])
def test_the_deprecated_global_log_prob_micro_size_plans_as_check_says(profile):
    """legacy floor-divides rollout.log_prob_micro_batch_size=8 by D into the per-GPU key (S4, 4 per GPU here);
    the engine never normalises it and stops at init_model's bare assert (B2): the planner agrees with check."""
    cfg = load_config(
        overrides=[
            "data.train_batch_size=16",
            f"{ARR}.rollout.n=2",
            "trainer.n_gpus_per_node=2",
            f"{ARR}.actor.ppo_mini_batch_size=8",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
            f"{ARR}.rollout.log_prob_micro_batch_size=8",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=null",
            "algorithm.adv_estimator=grpo",
        ],
        profile=profile,
    )
    first, errors = check(cfg).first_error, plan(cfg).summary["stage_errors"]
    if profile == "legacy":
        assert first is None and errors == {} and plan(cfg).summary["old_log_prob_micro_batches_per_rank"] == 4
    else:
        assert first.code == "B2" and errors["old_log_prob"]["code"] == "B2"


def test_the_plans_engine_rows_say_whose_model_they_are_about():
    code, out, _ = run("plan", f"{ARR}.model.path=Qwen/Qwen2.5-7B-Instruct", "data.max_response_length=8192")
    assert code == 0 and "Rollout engine on this machine (Qwen2.5-7B, from" in out and "max_model_len 128" not in out
    code, out, _ = run("plan", f"{ARR}.model.path=/no/such/model")
    assert "(tiny-qwen2, labkit's tiny CPU model:" in out.replace("\n", " ") or "tiny-qwen2, labkit" in out
