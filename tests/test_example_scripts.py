"""verl's own example scripts (tests/data/launch_scripts/verl-1dda039: every one that launches
``verl.trainer.main_ppo``), as a new user runs them: ``labkit check``, ``plan`` and ``memory`` answer each one, or stop
with one line that names what the caller's shell must supply, what verl 0.9.1 itself rejects, or the model labkit
cannot price. None is refused for its training engine (Megatron, VeOmni) or its rollout engine (SGLang)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "tests" / "data" / "launch_scripts" / "verl-1dda039" / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.rglob("*.sh") if re.search(r"-m\s+verl\.trainer\.main_ppo\b", p.read_text()))
MEGATRON = [
    p for p in SCRIPTS if re.search(r"model_engine=megatron|ppo_megatron_trainer|strategy=megatron", p.read_text())
]

REFUSED_FOR_ENGINE = (
    "model_engine=dp only",
    "must be one of ['vllm', 'hf']",
    "a Megatron or recipe base YAML is not modelled",
    "engine's config is not modelled",
)
# one-line stops that answer: a value only the caller's shell knows, a plugin's config group, a model or shape labkit cannot price (named, with the closest or the reason)
ANSWERING_STOPS = (
    "pass --set",
    "GROUP@PACKAGE",
    "closest known",
    "not priced",
    "cannot be null",  # model.path from an unset variable of the caller's shell (the script's own ':?' check)
)


def _run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_example_set_is_what_users_run():
    assert len(SCRIPTS) >= 80 and len(MEGATRON) >= 25


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_check_plan_and_memory_answer_every_example(capsys, script):
    for cmd in ("check", "plan", "memory"):
        code, out, err = _run(capsys, [cmd, str(script), *(["--json"] if cmd != "check" else [])])
        last = err.strip().splitlines()[-1] if err.strip() else ""
        assert code in (0, 1, 2), (cmd, code, err)
        assert not any(r in err for r in REFUSED_FOR_ENGINE), (cmd, last)
        if code == 2:
            assert any(s in last for s in ANSWERING_STOPS), (cmd, last)
        else:
            assert out.strip(), (cmd, "no answer printed")


@pytest.mark.parametrize("script", [p for p in MEGATRON if "lite" not in p.name][:8], ids=lambda p: p.name)
def test_a_megatron_example_is_planned_on_megatron(capsys, script):
    import json

    code, out, err = _run(capsys, ["plan", str(script), "--json"])
    assert code in (0, 1), err
    doc = json.loads(out)
    assert doc["summary"]["engine"] == "megatron"
    meg = doc["summary"]["megatron"]
    assert meg["dp"] == doc["summary"]["W"] // (meg["tp"] * meg["pp"] * meg["cp"])
