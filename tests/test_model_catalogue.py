"""The model catalogue (issue 38): a model recognised however verl users write ``model.path``, any catalogued
architecture read from a local config.json, unknown names refused with the closest ones, a --model stand-in never
silent, and docs/models.md generated from the data."""

import contextlib
import io
import json

import pytest

from labkit.cli import main
from labkit.config.messages import ConfigError
from labkit.config.verl_config import load_config
from labkit.memory.catalogue_doc import render
from labkit.memory.choice import model_note
from labkit.memory.data_tables import DATA
from labkit.memory.model_catalogue import model_names, model_shape
from labkit.memory.model_source import closest_names, known_shape, model_for

PATH = "actor_rollout_ref.model.path"
MODELS = json.loads((DATA / "model_shapes.json").read_text())["models"]


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B"),
        ("Qwen3-30B-A3B-Base", "Qwen3-30B-A3B"),
        ("~/models/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B"),
        ("/mnt/weight/QWEN3-235B-A22B", "Qwen3-235B-A22B"),
        ("${WORK_DIR}/Qwen3-Next-80B-A3B-Instruct", "Qwen3-Next-80B-A3B"),
        ("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen2.5-VL-7B"),
        ("deepseek-ai/DeepSeek-V3", "DeepSeek-V3"),
        ("$HOME/models/gpt-oss-20b-bf16", "gpt-oss-20b"),
        ("mistralai/Mistral-Nemo-Instruct-2407", "Mistral-Nemo-12B"),
        ("ByteDance-Seed/Seed-OSS-36B-Base", "Seed-OSS-36B"),
        ("XiaomiMiMo/MiMo-7B-RL", "MiMo-7B"),
        ("google/gemma-2-9b-it", "Gemma-2-9B"),
        ("hdfs://x/Qwen2.5-7B-Instruct/", "Qwen2.5-7B"),
        ("Qwen/Qwen3-4B-Thinking-2507", "Qwen3-4B"),
    ],
)
def test_names_are_recognised_however_written(path, name):
    assert known_shape(path).name == name
    assert model_for(load_config(None, [f"{PATH}={path}"])).name == name


def test_unknown_names_refused_with_the_three_closest_and_how_to_pass_a_folder():
    with pytest.raises(ConfigError) as err:
        model_for(load_config(None, [f"{PATH}=my-org/Qwen3-31B-A3B"]))
    text = str(err.value)
    assert "--model PATH" in text and "config.json" in text and "Qwen3-31B-A3B" in text
    assert len(closest_names("Qwen3-31B-A3B")) == 3 and "Qwen3-30B-A3B" in closest_names("Qwen3-31B-A3B")
    assert all(n in text for n in closest_names("Qwen3-31B-A3B"))


@pytest.mark.parametrize("name", [n for n in MODELS if "config" in MODELS[n]])
def test_a_local_config_json_of_every_catalogued_architecture_reads_as_the_catalogue(tmp_path, name):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MODELS[name]["config"]))
    local = model_for(load_config(None, [f"{PATH}={folder}"]))
    known = model_shape(name)
    assert local.param_count() == known.param_count() and local.active_param_count() == known.active_param_count()
    assert local.name == "ckpt" and local.architecture == known.architecture


def test_a_local_folder_by_explicit_model_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODELS["Qwen3-30B-A3B"]["config"]))
    shape = model_for(load_config(None, []), str(tmp_path))
    assert shape.is_moe and shape.num_moe_layers == 48


def _cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["memory", *args])
    return code, out.getvalue(), err.getvalue()


def test_a_stand_in_is_never_silent():
    cfg = load_config(None, [f"{PATH}=Qwen/Qwen3-30B-A3B"])
    note = model_note(cfg, "Qwen3-8B")
    assert note.startswith("note: pricing Qwen3-8B (8.19B params) while actor_rollout_ref.model.path names")
    assert "Qwen3-30B-A3B (30.5B total, 3.35B active)" in note
    assert model_note(cfg, "qwen3-30b-a3b") is None and model_note(cfg, None) is None
    unknown = model_note(load_config(None, [f"{PATH}=my-org/my-model"]), "Qwen3-8B")
    assert "'my-org/my-model', a model labkit does not know" in unknown
    code, out, _ = _cli(f"{PATH}=Qwen/Qwen3-30B-A3B", "--model", "Qwen2.5-0.5B")
    assert code in (0, 1) and out.splitlines()[0].startswith("note: pricing Qwen2.5-0.5B (0.494B params)")
    code, out, err = _cli(f"{PATH}=Qwen/Qwen3-30B-A3B", "--model", "Qwen2.5-0.5B", "--json")
    assert json.loads(out)["phases"] and err.startswith("note: pricing Qwen2.5-0.5B")  # stdout stays pure JSON


def test_docs_models_md_is_generated_from_the_data():
    assert (DATA.parent / "docs" / "models.md").read_text() == render()
    assert len(model_names()) >= 60
