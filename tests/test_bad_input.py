"""Bad input gets a clear error (exit code 2) in bounded time, never a hang, a traceback or a silent divergence;
an internal error exits 3 on one line; verl's messages stay whole on one line."""

from __future__ import annotations

import contextlib
import io
import os
import re
import time

import pytest

from labkit.cli import entry_point as cli
from labkit.config.messages import ConfigError
from labkit.config.verl_config import load_config
from labkit.config.yaml_input import MAX_FILE_BYTES, MAX_NODES

GRPO = ["algorithm.adv_estimator=grpo"]


def run(*argv: str) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


def bad(*argv: str, says: str, within_s: float = 5.0) -> str:
    code, out, err, took = run(*argv)
    assert code == 2, (code, out, err)
    assert says in err and "Traceback" not in err and err.count("\n") == 1, err
    assert took < within_s, took
    return err


def _alias_bomb(levels: int, mapping: bool) -> str:
    """The classic 'billion laughs': each level holds nine aliases of the one before (9**levels leaves)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(
            f"a{i}: &a{i} " + ("{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(9)) + "}" if mapping else f"[{refs}]")
        )
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("mapping", [False, True], ids=["list", "dict"])
def test_alias_bombs_are_refused_fast(tmp_path, mapping):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(9, mapping))
    assert path.stat().st_size < 1000  # a few hundred bytes that would expand to 9**9 nodes
    bad("check", str(path), says=f"has more than {MAX_NODES:,} nodes", within_s=2.0)


def test_aliases_that_stay_small_still_work(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("data:\n  train_batch_size: &b 16\n  val_batch_size: *b\n")
    assert load_config(path).get("data.val_batch_size") == 16


@pytest.mark.parametrize(
    "text, says",
    [
        ("a: &a [*a]\n", "recursive alias"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("a: " + "[" * 80 + "]" * 80 + "\n", "nested deeper than 64 levels"),
    ],
    ids=["recursive", "deep-5000", "deep-80"],
)
def test_recursive_and_deep_documents(tmp_path, text, says):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    bad("check", str(path), says=says)


def test_files_that_are_not_utf8_yaml_files(tmp_path):
    utf16, latin = tmp_path / "u16.yaml", tmp_path / "latin.yaml"
    utf16.write_bytes("data:\n  train_batch_size: 8\n".encode("utf-16"))
    latin.write_bytes(b"data:\n  train_batch_size: 8  # caf\xe9\n")
    bad("check", str(utf16), says="is UTF-16 text; save it as UTF-8")
    bad("check", str(latin), says="is not UTF-8 text (byte 34")
    bad("check", str(tmp_path), says="is a directory, not a config file")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    bad("check", str(fifo), says="is not a regular file", within_s=2.0)  # opening a FIFO would block
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    bad("check", str(big), says=f"labkit reads configs of at most {MAX_FILE_BYTES:,} bytes", within_s=2.0)
    bad("check", str(tmp_path / "missing.yaml"), says="no such config file")


@pytest.mark.parametrize(
    "text, key",
    [
        ("data:\n  train_batch_size: 8\n  train_batch_size: 16\n", "train_batch_size"),
        ("data:\n  train_batch_size: 8\ndata:\n  val_batch_size: 16\n", "data"),
    ],
    ids=["key", "section"],
)
def test_duplicate_keys_are_rejected_as_omegaconf_does(tmp_path, text, key):
    yaml = pytest.importorskip("yaml")
    omegaconf = pytest.importorskip("omegaconf")
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(yaml.constructor.ConstructorError) as verl_side:  # what verl's OmegaConf.load raises
        omegaconf.OmegaConf.load(path)
    assert verl_side.value.problem == f"found duplicate key {key}"
    err = bad("check", str(path), says=verl_side.value.problem)
    assert f"line {verl_side.value.problem_mark.line + 1}" in err


@pytest.mark.parametrize(
    "override, says",
    [
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${oc.select:foo.bar, [}", "interpolation default '['"),
        ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=null", "leave it unset to follow"),
        ("critic.ppo_mini_batch_size=null", "cannot be null"),
        ("actor_rollout_ref.actor.optim.lr=.inf", "must be a finite number, got inf"),
        ("actor_rollout_ref.actor.optim.lr=.nan", "must be a finite number, got nan"),
        ("actor_rollout_ref.actor.clip_ratio=-.inf", "must be a finite number"),
        ("data.train_batch_size=[1, 2", "cannot parse value"),
    ],
)
def test_bad_override_values(override, says):
    bad("check", override, says=says)
    with pytest.raises(ConfigError):
        load_config(overrides=[override]).get(override.split("=")[0])


def test_negative_seed_of_a_drawn_profile():
    bad("plan", "--lengths", "gsm8k-like", "--seed", "-1", says="must be a non-negative integer, got -1")


@pytest.mark.parametrize(
    "override",
    [
        "data.train_batch_size=100000000",
        "trainer.n_gpus_per_node=100000000",
        "data.train_batch_size=100000000000000",
        "actor_rollout_ref.actor.ppo_epochs=2147483648",
    ],
)
def test_sizes_without_bounds_answer_in_bounded_time(override):
    err = bad("plan", override, *GRPO, says="too large to plan per rank: ", within_s=3.0)
    assert "samples" in err
    code, out, err, took = run("check", override, *GRPO)
    assert code in (0, 1) and took < 3.0 and not err, (code, err, took)
    assert "verl" in out


def test_fix_search_is_bounded_for_huge_sizes():
    code, out, _, took = run("check", "data.train_batch_size=2147483647", "trainer.n_gpus_per_node=100000000", *GRPO)
    assert code == 1 and took < 3.0 and "(E1): real_train_batch_size (2147483647)" in out


def test_an_internal_error_exits_3_on_one_line(monkeypatch):
    def broken(ns):
        raise RuntimeError("planner bug")

    monkeypatch.setattr(cli, "cmd_plan", broken)
    code, out, err, _ = run("plan")
    assert (
        code == 3
        and err == "labkit: internal error: RuntimeError: planner bug (rerun with --debug for the traceback)\n"
    )
    code, _, err, _ = run("--debug", "plan")  # the traceback, and still the internal-error code
    assert code == 3 and "Traceback" in err and "RuntimeError: planner bug" in err


def test_verls_messages_stay_on_one_line():
    """A message longer than the 200 columns a piped console has is printed whole on one line."""
    code, out, _, _ = run(
        "check",
        "trainer.n_gpus_per_node=6",
        "data.train_batch_size=16",
        "actor_rollout_ref.rollout.n=12",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size=8",
        *GRPO,
    )
    long_lines = [line for line in out.splitlines() if len(line) > 200]
    assert code == 1 and long_lines, out
    assert all(not line.startswith(" " * 10) for line in out.splitlines()), "a wrapped continuation line"


# ---- the hostile-user reproducers: each failed (internal error, silent pass, wrong exit code) before its fix ----
NINES = "9" * 5000


@pytest.mark.parametrize(
    "argv, says",
    [
        (("memory", "--gpu-memory", "0.5"), "a GPU's capacity is 1 GiB to 1 PiB"),
        (("memory", "--gpu-memory", "1" + "0" * 400), "--gpu-memory: cannot read"),
        (("memory", "--gpu", ""), "--gpu: an empty name"),
        (("memory", "--gpu=--"), "--gpu needs a value"),
        (("memory", "--margin", "nan"), "--margin: nan GiB"),
        (("check", f"data.train_batch_size={NINES}"), "a value YAML cannot convert"),
        (
            (
                "check",
                "--profile",
                "legacy",
                "data.train_batch_size=9223372036854775808",
                "trainer.n_gpus_per_node=1",
                "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                "actor_rollout_ref.rollout.n=4",
            ),
            "labkit reads sizes up to 2**48",
        ),
        (("check", "--lengths", "nope"), "unknown length profile 'nope'"),
        (("check", "--lengths", "nan"), "unknown length profile"),
        (("check", "--lengths", "-5"), "unknown length profile"),
        (("check", "--lengths", "1e9"), "unknown length profile"),
        (("check", "--lengths", ""), "--lengths is empty"),
        (("check", "--lengths", "1,2,0"), "each length must be a positive integer"),
        (("plan", "--bogus"), "unrecognized arguments: --bogus"),
    ],
)
def test_hostile_options_and_values_get_one_line_and_exit_2(argv, says):
    bad(*argv, says=says, within_s=3.0)


def test_check_validates_lengths_even_when_verl_rejects_the_config():
    """``check`` used to exit 0 with "verl accepts" for --lengths nope, and to skip --lengths when verl rejects."""
    accepted = (
        "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=4",
        *GRPO,
    )
    assert run("check", *accepted)[0] == 0
    bad("check", *accepted, "--lengths", "nope", says="unknown length profile 'nope'")
    bad("check", "--lengths", "nope", says="unknown length profile 'nope'")  # verl rejects the default config (E7)


def test_a_yaml_tag_that_cannot_convert_is_an_input_error(tmp_path):
    path = tmp_path / "tag.yaml"
    path.write_text("data:\n  train_batch_size: !!int abc\n")
    bad("check", str(path), says="a value YAML cannot convert")
    path.write_text('data:\n  train_batch_size: !!int ""\n')
    bad("check", str(path), says="a value YAML cannot convert")


def test_a_plan_past_a_mesh_verl_cannot_build_is_not_an_internal_error():
    code, out, err, _ = run(
        "plan",
        "trainer.nnodes=256",
        "actor_rollout_ref.rollout.pipeline_model_parallel_size=512",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4096",
        "actor_rollout_ref.rollout.max_num_seqs=24",
        "--lengths",
        "gsm8k-like",
    )
    assert code in (0, 1) and "internal error" not in err, err


def test_messages_quote_at_most_a_clipped_piece_of_the_input():
    err = bad("check", "a" * 100_000 + "=1", says="unknown key")
    assert len(err) < 700 and re.search(r"…\(100,0\d\d characters\)", err), err
    err = bad("check", "--lengths", "x" * 15_000, says="--lengths")
    assert len(err) < 700


@pytest.mark.parametrize(
    "text, says",
    [
        ("".join(f"k{i}: {i}\n" for i in range(150_000)), "lines or ':' / ',' separators"),
        ("{" + ", ".join(f"k{i}: {i}" for i in range(60_000)) + "}", "lines or ':' / ',' separators"),
        ("a: [" + ",".join(["1"] * 99_000) + "]", "lines or ':' / ',' separators"),
    ],
)
def test_large_documents_are_refused_in_linear_time(tmp_path, text, says):
    path = tmp_path / "big.yaml"
    path.write_text(text)
    bad("check", str(path), says=says, within_s=1.0)


def test_a_document_at_the_line_cap_answers_within_a_second(tmp_path):
    from labkit.config.yaml_input import MAX_LINES

    path = tmp_path / "cap.yaml"
    path.write_text("".join(f"k{i}: {i}\n" for i in range(MAX_LINES - 1)))
    start = time.perf_counter()
    code, _, err, _ = run("check", str(path))
    assert code == 2 and time.perf_counter() - start < 1.0, err
