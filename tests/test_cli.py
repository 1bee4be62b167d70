"""labkit.cli: `labkit plan` tables and --json, `labkit check` verdicts and exit codes (0 / 1 / 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.cli import main
from labkit.config.verl_config import SEED_EXAMPLE
from labkit.trace import StepTrace

ROOT = Path(__file__).resolve().parent.parent
ARR = "actor_rollout_ref"


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_text_has_the_key_numbers(capsys):
    code, out, _ = run(capsys, "plan", *SEED_EXAMPLE, "--profile", "legacy")
    assert code == 0
    for text in (
        "Pipeline at a glance (legacy profile)",
        "60 prompts",
        "720 samples",
        "240 rows",
        "120 rows",
        "15 micro-batches × 8 rows",
        "M′ = (M·n)//(W//sp) = (60·12)//(6//1) = 120",
        "GA = 120/8 = 15",
        "6 / 6 / 1",
        "2 / 3 / 8",
        "60 × 12 = 720 samples",
        "1/GA = 1/15",
        "all_gather(params)×15",
    ):
        assert text in out, text
    assert "Traceback" not in out


def test_plan_with_lengths_shows_tokens_and_metrics(capsys):
    code, out, _ = run(capsys, "plan", *SEED_EXAMPLE, "--lengths", "gsm8k-like", "--seed", "3")
    assert code == 0
    assert "global_seqlen/balanced_max" in out and "tokens total" in out


def test_plan_json_round_trips(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        *SEED_EXAMPLE,
        "trainer.use_v1=false",
        "--json",
        "--lengths",
        "gsm8k-like",
        "--dispatch",
        "all_gather",
    )
    assert code == 0
    data = json.loads(out)
    tr = StepTrace.from_dict(data)
    assert tr.to_dict() == data
    assert tr.summary["dispatch"] == "all_gather" and tr.at("generate")[0].extra["rows_in"] == 120


def test_plan_explicit_lengths_and_yaml(capsys, tmp_path):
    cfg = tmp_path / "one.yaml"
    cfg.write_text(
        "data:\n  train_batch_size: 1\n  max_prompt_length: 1024\n  max_response_length: 8192\n"
        "trainer:\n  n_gpus_per_node: 1\n"
        f"{ARR}:\n  rollout:\n    n: 8\n    tensor_model_parallel_size: 1\n    agent:\n      num_workers: 1\n"
        "  actor:\n    ppo_mini_batch_size: 1\n    use_dynamic_bsz: true\n    ppo_max_token_len_per_gpu: 13312\n"
        "algorithm:\n  adv_estimator: grpo\n"
    )
    code, out, _ = run(
        capsys,
        "plan",
        str(cfg),
        "trainer.balance_batch=false",
        "--json",
        "--lengths",
        "800,6500,1200,4000,9000,2500,1500,7500",
    )
    assert code == 0
    tr = StepTrace.from_dict(json.loads(out))
    assert [m.tokens for m in tr.at("old_log_prob")[0].micro_batches] == [11300, 10500, 11200]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["plan", "trainer.n_gpus_per_nod=8"], "Did you mean 'trainer.n_gpus_per_node'?"),
        (["check", "trainer.n_gpus_per_nod=8"], "Did you mean 'trainer.n_gpus_per_node'?"),
        (["check", "data.train_batch_size=abc"], "'data.train_batch_size' expects int"),
        (["plan", "--lengths", "seed-8"], "outside [1, 1024]"),
        (["plan", "--lengths", "no-such-profile"], "unknown length profile"),
        (["plan", "no_such_file.yaml"], "no such config file"),
    ],
)
def test_input_errors_exit_2_without_traceback(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err and "Traceback" not in err + out


def test_malformed_yaml_exits_2(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    code, _, err = run(capsys, "check", str(bad))
    assert code == 2 and "malformed YAML" in err


def test_check_failing_config_exits_1_with_verls_message(capsys):
    pytest.importorskip("labkit.validate.report", reason="labkit.validate.report not written yet")
    code, out, _ = run(
        capsys,
        "check",
        "data.train_batch_size=7",
        f"{ARR}.rollout.n=1",
        "trainer.n_gpus_per_node=6",
        f"{ARR}.actor.ppo_mini_batch_size=7",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=1",
        "--profile",
        "legacy",
    )
    assert code == 1
    assert "real_train_batch_size (7) must be divisible by minimal possible batch size (6)" in out
    assert "AssertionError" in out


def test_check_runtime_failure_exits_1(capsys):
    """A config verl's validation accepts but whose first step stops (n=13: 780 rows over 8 agent-loop workers)."""
    pytest.importorskip("labkit.validate.report", reason="labkit.validate.report not written yet")
    code, out, _ = run(
        capsys,
        "check",
        *SEED_EXAMPLE,
        f"{ARR}.rollout.n=13",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=10",
        "--profile",
        "legacy",
    )
    assert code == 1
    assert "only support equal chunk. Got size of DataProto 780 and chunk 8." in out


def test_check_passing_config_exits_0(capsys):
    pytest.importorskip("labkit.validate.report", reason="labkit.validate.report not written yet")
    code, out, _ = run(capsys, "check", *SEED_EXAMPLE)
    assert code == 0 and "verl accepts this config" in out


def test_python_dash_m_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "labkit.cli", "plan", *SEED_EXAMPLE, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert StepTrace.from_dict(json.loads(proc.stdout)).summary["samples"] == 720
    proc = subprocess.run(
        [sys.executable, "-m", "labkit.cli", "check", "trainer.nnode=2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Did you mean 'trainer.nnodes'?" in proc.stderr
    assert "Traceback" not in proc.stderr
