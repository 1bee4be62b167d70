"""Nothing a user sets is silently unpriced: every key of every verl release's trainer YAMLs (the installed 0.9.1,
0.9.0, 0.8.0 and 0.7.1 oracles, and 0.1 to 0.4 as data/verl_old_releases.json holds them) has a memory effect in
data/key_effects.yaml; what the registry calls priced is what labkit's memory model reads, and the other way round;
and an answer names each key it did not price."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _memory_reads import memory_reads

from labkit.cli import main
from labkit.config.key_effects import EFFECTS, REGISTRY, effect_of, unpriced
from labkit.config.messages import ConfigError
from labkit.config.verl_config import load_config
from labkit.memory.model_source import PATH_KEY
from labkit.rules.run import Run

ROOT = Path(__file__).resolve().parents[1]
GENERATED = (
    "_generated_ppo_trainer.yaml",
    "_generated_ppo_megatron_trainer.yaml",
    "_generated_ppo_veomni_trainer.yaml",
    "_generated_ppo_torchtitan_trainer.yaml",
)


def _leaves(node, prefix=""):
    if isinstance(node, dict) and node:
        return [k for key, value in node.items() for k in _leaves(value, f"{prefix}.{key}" if prefix else str(key))]
    return [prefix]


def _release_keys() -> dict[str, set[str]]:
    verl = pytest.importorskip("verl")
    folders = {
        "0.9.1": Path(verl.__file__).parent / "trainer" / "config",
        "0.9.0": ROOT / ".oracle" / "verl-0.9.0" / "verl" / "trainer" / "config",
        "0.8.0": ROOT / ".oracle" / "verl-0.8.0" / "verl" / "trainer" / "config",
        "0.7.1": ROOT / ".oracle" / "verl-0.7.1" / "verl" / "trainer" / "config",
    }
    out: dict[str, set[str]] = {}
    for release, folder in folders.items():
        if not folder.exists():
            pytest.skip(f"verl {release}'s oracle is not installed ({folder})")
        keys = set()
        for name in GENERATED:
            if (folder / name).exists():
                keys |= set(_leaves(yaml.safe_load((folder / name).read_text())))
        out[release] = {k for k in keys if not k.startswith("hydra") and k != "defaults"}
    old = json.loads((ROOT / "data" / "verl_old_releases.json").read_text())["releases"]
    out.update({release: set(keys) for release, keys in old.items()})
    return out


def test_every_key_of_every_release_has_a_memory_effect():
    keys = _release_keys()
    assert len(keys["0.9.1"]) > 1000 and len(keys["0.7.1"]) > 500
    missing = {release: sorted(k for k in ks if effect_of(k) is None) for release, ks in keys.items()}
    assert {r: m for r, m in missing.items() if m} == {}


def test_every_entry_says_what_or_why():
    for entry in yaml.safe_load(REGISTRY.read_text()):
        assert entry["effect"] in EFFECTS and entry["keys"], entry
        if entry["effect"] == "not_priced":
            assert len(entry["would"].split()) >= 5, entry
        if entry["effect"] == "none":
            assert len(entry["why"].split()) >= 5, entry


def test_priced_means_read_by_the_memory_model():
    """Every key the memory model reads (over configs that exercise every part of it) is called priced, and every
    key the registry names priced is read by one of them (the model path is read when the model is chosen)."""
    read = memory_reads()
    not_priced = sorted(k for k in read if (effect_of(k) or None) is None or effect_of(k).effect != "priced")
    assert not_priced == []
    exact = [
        k for e in yaml.safe_load(REGISTRY.read_text()) if e["effect"] == "priced" for k in e["keys"] if "*" not in k
    ]
    assert sorted(k for k in exact if k not in read and k != PATH_KEY) == []


def test_an_answer_names_what_it_did_not_price():
    cfg = load_config(
        None,
        [
            "actor_rollout_ref.rollout.enforce_eager=False",  # not priced: CUDA graphs
            "actor_rollout_ref.actor.optim.lr=3e-6",  # no memory effect: not named
            "actor_rollout_ref.actor.use_torch_compile=false",  # the engine reads fsdp_config's key instead
            "+actor_rollout_ref.model.override_config.attn_implementation=eager",
            "algorithm.adv_estimator=grpo",
        ],
        lenient=True,
    )
    cfg.override(["data.max_start_length=2048"])  # Search-R1's key: no verl release has it
    from labkit.memory.settings import MemorySettings
    from labkit.memory.step_memory import step_phases

    with cfg.recording() as read:
        step_phases(cfg, MemorySettings.from_config(cfg, "Qwen2.5-7B", 80 * 2**30))
    named = {i["key"]: i["effect"] for i in unpriced(cfg, read, path=Run.resolve(cfg).audit_path)}
    assert named == {
        "actor_rollout_ref.rollout.enforce_eager": "not_priced",
        "actor_rollout_ref.actor.use_torch_compile": "no_effect",
        "actor_rollout_ref.model.override_config.attn_implementation": "not_priced",
        "data.max_start_length": "not_verl",
    }


def test_the_memory_command_lists_them_before_its_verdict_and_in_json(capsys):
    args = [
        "memory",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",  # verl rejects the bare defaults (E7): exit 1, said first
        "actor_rollout_ref.rollout.enforce_eager=False",
        "data.max_obs_length=500",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out.splitlines()
    lines = [i for i, line in enumerate(text) if line.startswith(("not priced:", "not a verl key:"))]
    verdict = next(i for i, line in enumerate(text) if line.startswith("verdict:"))
    assert len(lines) == 2 and max(lines) < verdict
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {i["key"] for i in doc["not_priced"]} == {"actor_rollout_ref.rollout.enforce_eager", "data.max_obs_length"}


def test_a_fork_key_is_named_never_refused_and_check_still_refuses_it(capsys):
    """memory answers a Search-R1 config; check keeps verl's own verdict on a key verl's Hydra would refuse."""
    config = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-3B", "actor_rollout_ref.actor.use_dynamic_bsz=true"]
    assert main(["memory", "data.max_start_length=2048", *config]) == 0
    assert "not a verl key: data.max_start_length=2048" in capsys.readouterr().out
    assert main(["check", "data.max_start_length=2048"]) == 2


def test_a_launch_value_known_only_at_run_time_is_read_on_when_it_decides_only_a_name():
    """A script's value from the caller's environment that decides a run name (a key labkit does not model, no memory
    effect in the registry) is read on and named as not read, with the variable to --set; one that decides a batch
    size still stops the answer."""
    from labkit.config.text_input import read_config_text

    script = (
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-3B "
        "trainer.experiment_name=$RUN_NAME trainer.project_name=${PROJECT}-grpo data.train_batch_size=64"
    )
    read = read_config_text(script)
    named = {arg.split("=")[0]: why for arg, why in read.not_read}
    assert set(named) == {"trainer.experiment_name", "trainer.project_name"}
    assert all("is never set by the script" in why and "pass --set" in why for why in named.values())
    assert all(effect_of(key).effect == "none" for key in named)
    assert not any(o.startswith(("trainer.experiment_name", "trainer.project_name")) for o in read.overrides)
    with pytest.raises(ConfigError, match=r"\$BATCH .*it decides 'data.train_batch_size=…', a key labkit models"):
        read_config_text(script.replace("data.train_batch_size=64", "data.train_batch_size=$BATCH"))


def test_the_docs_page_lists_every_key_as_the_registry_classifies_it():
    """docs/memory_keys.md is the registry rendered (priced, ignored by verl, not priced with what it would change,
    no effect with why): a registry change without the page fails here."""
    from labkit.memory.key_effects_doc import render

    page = (Path(__file__).resolve().parent.parent / "docs" / "memory_keys.md").read_text()
    assert page == render(), "docs/memory_keys.md is stale: write labkit.memory.key_effects_doc.render() to it"
    patterns = sum(len(e["keys"]) for e in yaml.safe_load(REGISTRY.read_text()))
    assert page.count("`") // 2 >= patterns
