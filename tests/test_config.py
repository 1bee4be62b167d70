"""labkit.config.verl_config: verl-style YAML + Hydra-style overrides, verl's defaults and interpolations, clear errors."""

import pytest

from labkit.config.messages import ConfigError
from labkit.config.verl_config import SEED_EXAMPLE, load_config


def test_defaults_and_interpolations_follow_verl():
    cfg = load_config()
    assert cfg.get("data.train_batch_size") == 1024 and cfg.n_gpus == 8
    # ${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false} and friends follow until set explicitly
    cfg.override(
        ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096"]
    )
    assert cfg.get("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz") is True
    assert cfg.get("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu") == 4096
    cfg.override(["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=2048"])
    assert cfg.get("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu") == 2048
    assert cfg.get("critic.ppo_mini_batch_size") == cfg.get("actor_rollout_ref.actor.ppo_mini_batch_size")


def test_critic_micro_quirk_is_reproduced():
    """critic.ppo_micro_batch_size_per_gpu interpolates the deprecated key (the root of verl's E14 quirk)."""
    cfg = load_config(overrides=["critic.ppo_micro_batch_size=4"])
    assert cfg.get("critic.ppo_micro_batch_size_per_gpu") == 4


def test_profiles_differ_where_verl_yaml_differs():
    assert load_config(profile="engine").get("critic.model.use_remove_padding") is True
    assert load_config(profile="legacy").get("critic.model.use_remove_padding") is False
    with pytest.raises(ConfigError, match="profile"):
        load_config(profile="v0.3")


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor_rollout_ref.rollout.nn=3", "Did you mean 'actor_rollout_ref.rollout.n'"),
        ("data.train_batch_size=-1", "must be >= 1"),
        ("data.train_batch_size=0", "must be >= 1"),
        ("data.train_batch_size=abc", "expects int"),
        ("data.train_batch_size=2.5", "expects int"),
        ("trainer.balance_batch=maybe", "expects bool"),
        ("actor_rollout_ref.actor.strategy=deepspeed", "must be one of"),
        ("--config.actor_rollout_ref.rollout.n=12", "no '--' prefix"),
        ("actor_rollout_ref.rollout.n", "key=value"),
        ("data.train_batch_size=[1", "cannot parse"),
    ],
)
def test_bad_overrides_are_clear_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config(overrides=[override])


def test_unknown_verl_keys_are_accepted_and_listed():
    cfg = load_config(overrides=["data.train_files=/x.parquet", "trainer.project_name=demo"])
    assert cfg.ignored == {"data.train_files": "/x.parquet", "trainer.project_name": "demo"}


def test_scientific_floats_and_reset():
    cfg = load_config(overrides=["actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.rollout.n=4"])
    assert cfg.get("actor_rollout_ref.actor.optim.lr") == 1e-3
    cfg.override(["~actor_rollout_ref.rollout.n"])
    assert cfg.get("actor_rollout_ref.rollout.n") == 1


def test_yaml_file_nested_and_interpolated(tmp_path):
    path = tmp_path / "ppo.yaml"
    path.write_text(
        "defaults: [ppo_trainer]\n"
        "data: {train_batch_size: 60, max_prompt_length: 100, train_files: x}\n"
        "actor_rollout_ref:\n  rollout: {n: 12, prompt_length: '${data.max_prompt_length}'}\n"
        "  actor: {ppo_mini_batch_size: '${oc.select:data.train_batch_size,8}'}\n"
    )
    cfg = load_config(path, ["trainer.n_gpus_per_node=6"])
    assert cfg.get("actor_rollout_ref.rollout.prompt_length") == 100
    assert cfg.get("actor_rollout_ref.actor.ppo_mini_batch_size") == 60
    assert cfg.actor_rollout_ref.rollout.n == 12 and cfg.n_gpus == 6


@pytest.mark.parametrize(
    "text, message",
    [
        ("data: [unclosed", "malformed YAML"),
        ("- just\n- a list\n", "mapping at the top level"),
        ("data: {train_batch_sise: 8}\n", "Did you mean 'data.train_batch_size'"),
    ],
)
def test_bad_yaml_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_missing_file_and_attribute_access():
    with pytest.raises(ConfigError, match="cannot read"):
        load_config("/nonexistent/ppo.yaml")
    cfg = load_config(overrides=SEED_EXAMPLE)
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8
    with pytest.raises(ConfigError, match="Did you mean"):
        _ = cfg.actor_rollout_ref.actor.ppo_mini_batch


@pytest.mark.parametrize(
    "override, profile, tail",
    [
        ("trainer.use_v1=false", "legacy", "(the key exists in the engine profile's verl only)"),
        ("actor_rollout_ref.actor.megatron.grad_offload=true", "engine", "the legacy profile's verl only)"),
        ("actor_rollout_ref.rollout.engine_kwargs.sglang.x=1", "engine", "adds a key to it only with '+')"),
        ("actor_rollout_ref.actor.model_engine=megatron", "engine", "the top-level group model_engine=megatron)"),
    ],
)
def test_what_verls_hydra_refuses_is_recorded_in_its_words_and_the_rest_still_read(override, profile, tail):
    cfg = load_config(overrides=[override, "data.train_batch_size=7"], profile=profile)
    (stop,) = cfg.hydra_stops
    key = override.split("=")[0]
    assert f"Hydra stops: Could not override '{key}'. To append to your config use +{key}=" in stop
    assert stop.endswith(tail) and cfg.get("data.train_batch_size") == 7 and key not in cfg.values


def test_a_key_of_the_other_profile_is_named_as_such():
    assert load_config(overrides=["trainer.use_v1=false"], profile="legacy").hydra_stops
    assert load_config(overrides=["trainer.use_v1=false"], profile="engine").get("trainer.use_v1") is False
    assert load_config(profile="engine").get("trainer.use_v1") is True  # verl 0.9.1's YAML default
