"""No key verl accepts is called unknown: every key of verl 0.9.1's generated trainer YAMLs (FSDP, Megatron, VeOmni,
as installed for the tests) and of 0.7.1's (legacy) is read by labkit, modelled or accepted, with its own YAML value;
and every rollout name verl 0.9.1's rollout config accepts is planned."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from labkit.config.keys import KEYS
from labkit.config.verl_config import VerlConfig
from labkit.plan.step import plan

ROOT = Path(__file__).resolve().parents[1]
ORACLE_071 = ROOT / ".oracle" / "verl-0.7.1" / "verl" / "trainer" / "config"


def _verl091_config_dir() -> Path:
    verl = pytest.importorskip("verl")
    return Path(verl.__file__).parent / "trainer" / "config"


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_leaves(v, path + "."))
        else:
            out[path] = v
    return out


def _yaml_leaves(path: Path) -> dict[str, object]:
    return _leaves(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize(
    "name, profile, engine",
    [
        ("_generated_ppo_trainer.yaml", "engine", None),
        ("_generated_ppo_megatron_trainer.yaml", "engine", "megatron"),
        ("_generated_ppo_veomni_trainer.yaml", "engine", "veomni"),
        ("_generated_ppo_trainer.yaml", "legacy", None),
        ("_generated_ppo_megatron_trainer.yaml", "legacy", "megatron"),
    ],
)
def test_every_key_of_verls_yaml_is_read_with_its_own_value(name, profile, engine):
    folder = _verl091_config_dir() if profile == "engine" else ORACLE_071
    if not (folder / name).exists():
        pytest.skip(f"{folder / name} not installed")
    leaves = _yaml_leaves(folder / name)
    assert len(leaves) > 300
    cfg = VerlConfig(profile=profile)
    if engine:
        cfg.select_engine(engine)
    for key, value in leaves.items():
        if key.startswith("hydra.") or key == "defaults" or value == "???":  # "???": Hydra's mandatory value
            continue
        cfg.set(key, value, origin=f"{name}: {key}")  # raises ConfigError for a key labkit calls unknown
    assert not cfg.hydra_stops, cfg.hydra_stops[:3]
    modelled = [k for k in leaves if k in KEYS]
    assert len(modelled) > 40  # the batch keys are modelled, not only accepted


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm", "hf"])
def test_every_rollout_name_verl_accepts_is_planned(name):
    rollout_yaml = _verl091_config_dir() / "rollout" / "rollout.yaml"
    if rollout_yaml.exists():
        assert name in rollout_yaml.read_text() or name == "hf"
    cfg = VerlConfig(profile="engine").override(
        [f"actor_rollout_ref.rollout.name={name}", "algorithm.adv_estimator=grpo"]
    )
    tr = plan(cfg)
    assert tr.stage("generate") is not None
