"""``--verl VERSION``: each release picks the profile and loop it runs, and where verl 0.8.0 and 0.9.0 batch
differently from 0.9.1 the plan follows them. verl 0.8.0's own ``rearrange_micro_batches`` (installed under
``.oracle/verl-0.8.0``) is the oracle for the engine's dynamic micro-batches of 0.8."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from _oracle_legacy import load_legacy_module, run_rearrange_case

from labkit.cli import main
from labkit.config import versions
from labkit.config.verl_config import load_config
from labkit.plan.step import plan
from labkit.rules.geometry import BatchGeometry

ROOT = Path(__file__).resolve().parents[1]
ORACLE_080 = ROOT / ".oracle" / "verl-0.8.0"
ARR = "actor_rollout_ref"


@pytest.mark.parametrize(
    "text, profile, use_v1, dispatch",
    [
        ("0.5", "legacy", None, "all_gather"),
        ("0.6.1", "legacy", None, "mesh"),
        ("v0.7.1", "legacy", None, "mesh"),
        ("0.8.0", "engine", False, "mesh"),
        ("0.9.0", "engine", True, "mesh"),
        ("0.9.1", "engine", True, "mesh"),
    ],
)
def test_each_release_runs_its_profile_and_loop(text, profile, use_v1, dispatch):
    rel = versions.release(text)
    assert (rel.profile, rel.use_v1, rel.dispatch) == (profile, use_v1, dispatch)
    assert versions.resolve(None, text) == (profile, rel)
    cfg = versions.apply_release(load_config(profile=profile), rel)
    assert BatchGeometry.from_config(cfg).loop == {None: "legacy", False: "v0", True: "v1"}[use_v1]


def test_bad_versions_and_contradictions_are_one_line_errors(capsys):
    assert main(["check", "--verl", "0.0.9"]) == 2
    assert "labkit models verl 0.1, 0.2" in capsys.readouterr().err
    assert main(["check", "--verl", "0.8", "--profile", "legacy"]) == 2
    assert "contradicts" in capsys.readouterr().err
    assert main(["check", "--verl", "0.8.0", "trainer.use_v1=true"]) == 2
    assert "has no v1 loop" in capsys.readouterr().err


def test_the_answer_names_the_release_and_its_differences(capsys):
    main(["check", "--verl", "0.8", "data.train_batch_size=16", f"{ARR}.actor.ppo_mini_batch_size=16"])
    out = capsys.readouterr().out
    assert "as verl 0.8 runs it" in out and "not a cap" in out


def test_v090_padding_rows_are_two_tokens():
    over = ["data.train_batch_size=6", f"{ARR}.rollout.n=1", "trainer.n_gpus_per_node=4"]
    over += [f"{ARR}.actor.ppo_mini_batch_size=6", f"{ARR}.actor.use_dynamic_bsz=true", "algorithm.adv_estimator=grpo"]
    tr090 = plan(versions.apply_release(load_config(None, over), versions.release("0.9.0")), [100] * 6)
    tr091 = plan(load_config(None, over), [100] * 6)
    for tr, tokens in ((tr090, 2), (tr091, 128)):  # lcm(D 4, M·n 6) = 12: 6 padding rows in both
        pad = tr.summary["v1_padding"]["padding_rows"]
        assert pad == 6 and tr.summary["tokens"]["total"] == 600 + pad * tokens


def _dynamic_config(rng: random.Random) -> list[str]:
    gpus = rng.choice([1, 2, 4])
    return [
        f"trainer.n_gpus_per_node={gpus}",
        f"data.train_batch_size={gpus * rng.choice([2, 4])}",
        f"{ARR}.rollout.n={rng.choice([2, 4])}",
        f"{ARR}.rollout.tensor_model_parallel_size=1",
        f"{ARR}.actor.ppo_mini_batch_size={gpus}",
        f"{ARR}.actor.use_dynamic_bsz=true",
        f"{ARR}.actor.ppo_max_token_len_per_gpu={rng.choice([900, 1500, 3000])}",
        "data.max_prompt_length=256",
        "data.max_response_length=600",
        f"{ARR}.rollout.agent.num_workers=1",
        "algorithm.adv_estimator=grpo",
    ]


@pytest.mark.skipif(
    not ORACLE_080.is_dir() and not os.environ.get("CI"), reason="verl 0.8.0 oracle not installed (make venv)"
)
def test_engine_080_dynamic_micro_batches_equal_verl_080():
    sb = load_legacy_module(ORACLE_080)
    rng = random.Random(80)
    compared = differs = 0
    for _ in range(40):
        cfg = versions.apply_release(load_config(None, _dynamic_config(rng)), versions.release("0.8.0"))
        geo = BatchGeometry.from_config(cfg)
        lengths = [rng.randint(20, 856) for _ in range(geo.samples)]
        tr = plan(cfg, lengths)
        assert not tr.summary["stage_errors"], tr.summary["stage_errors"]
        budget = cfg.get(f"{ARR}.rollout.log_prob_max_token_len_per_gpu")
        recs = sorted(tr.at("old_log_prob"), key=lambda r: r.rank)
        rank_rows = [r.extra["indices"] for r in sorted(tr.at("balance"), key=lambda r: r.rank)]
        case = {"ranks": [[lengths[i] for i in x] for x in rank_rows], "layout": "nested", "budget": budget}
        got = run_rearrange_case(sb, {**case, "sync": True})
        for r, res in enumerate(got):
            want = [[rank_rows[r][j] for j in part] for part in res["idx"]]
            assert [mb.indices for mb in recs[r].micro_batches] == want
            compared += 1
        differs += any(mb.tokens > budget for r in recs for mb in r.micro_batches)
    assert compared >= 40
    assert differs, "no case where 0.8.0's budget lets a micro-batch exceed it: the comparison would not tell"
