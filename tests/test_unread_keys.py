"""Keys verl never reads where they are set: data/unread_keys.yaml against the code of the installed verl 0.7.1,
0.8.0 and 0.9.1 (scripts/verl_key_reads.py scans each path's code), and every answer naming them."""

from __future__ import annotations

import ast
import fnmatch
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from labkit.config.unread_keys import SP_MIXER_PATCHES, audit_entry, entries, never_read
from labkit.config.verl_config import load_config
from labkit.config.versions import RELEASES, apply_release
from labkit.memory.model_source import check_shape
from labkit.memory.settings import MemorySettings
from labkit.memory.verdict import memory_report
from labkit.rules.run import Run
from labkit.validate.report import check

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import verl_key_reads as scan  # noqa: E402

pytestmark = pytest.mark.xdist_group("verl_scan")  # one worker parses verl's code once for every test here


def _installed() -> list[scan.RunPath]:
    paths = [p for p in scan.PATHS if scan.oracle_root(p) is not None]
    if not paths:
        pytest.skip("no verl oracle is installed (make test installs 0.9.1, 0.8.0 and 0.7.1)")
    return paths


def test_every_key_no_code_reads_is_in_the_audit():
    missing = {}
    for path in _installed():
        loose = [key for key in scan.unread(path) if audit_entry(key, path.name) is None]
        if loose:
            missing[path.name] = loose
    assert not missing, f"keys verl's code never reads on these paths, not in data/unread_keys.yaml: {missing}"


def test_every_unread_entry_is_what_the_scan_finds():
    """Each scanned entry covers keys of that path's YAML, and none of them is read there by name."""
    wrong = []
    for entry in entries():
        if entry.kind != "unread" or not entry.scan:
            continue
        for path in _installed():
            if not any(fnmatch.fnmatchcase(path.name, at) for at in entry.at):
                continue
            root = scan.oracle_root(path)
            covered = [k for k in scan.yaml_keys(root, path.yaml) if entry.covers(k, path.name)]
            read = sorted(set(covered) - set(scan.unread(path)))
            if read:
                wrong.append((entry.keys, path.name, read))
    assert not wrong, f"entries whose keys verl's code reads by name on that path: {wrong}"


def test_an_entry_matches_keys_on_each_path_it_names():
    installed = {p.name for p in _installed()}
    dead = []
    for entry in entries():
        for at in entry.at:
            paths = [p for p in scan.PATHS if fnmatch.fnmatchcase(p.name, at) and p.name in installed]
            hits = [
                p for p in paths if any(entry.covers(k, p.name) for k in scan.yaml_keys(scan.oracle_root(p), p.yaml))
            ]
            if paths and not hits:
                dead.append((entry.keys, at))
    assert not dead, f"entries that match no key of the YAMLs they name: {dead}"


def _symbols(file: Path) -> set[str]:
    out = set()
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, ast.ClassDef):
            out.add(node.name)
            out |= {
                f"{node.name}.{n.name}" for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
    return out


def test_each_where_is_in_the_code_of_every_release_it_names():
    missing = []
    for entry in entries():
        file, _, symbol = entry.where.partition(": ")
        for path in _installed():
            if not any(fnmatch.fnmatchcase(path.name, at) for at in entry.at):
                continue
            source = scan.oracle_root(path) / file
            if not source.exists() or symbol not in _symbols(source):
                missing.append((entry.where, path.release))
    assert not missing, f"code paths that verl's release does not have: {sorted(set(missing))}"


def test_transformer_config_keys_passed_to_megatron_core_are_its_fields():
    """``override_transformer_config`` goes whole to megatron-core: the keys the scan cannot see read are
    TransformerConfig's own fields."""
    mcore = ROOT / ".oracle" / "megatron-core-0.16.1"
    config = mcore / "megatron" / "core" / "transformer" / "transformer_config.py"
    if not config.exists():
        pytest.skip("megatron-core's oracle is not installed")
    fields = {
        n.target.id
        for n in ast.walk(ast.parse(config.read_text()))
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    passed = set()
    for path in _installed():
        for key in scan.unread(path):
            entry = audit_entry(key, path.name)
            if entry.kind == "passed" and entry.to == "megatron.core.transformer.TransformerConfig":
                passed.add(key.rsplit(".", 1)[-1])
    assert passed and passed <= fields, f"not TransformerConfig fields: {passed - fields}"


@pytest.mark.parametrize(
    ("profile", "overrides", "release"),
    [
        ("engine", ["trainer.use_v1=true"], None),
        ("engine", ["trainer.use_v1=false", "actor_rollout_ref.actor.strategy=megatron"], None),
        ("legacy", [], None),
        ("engine", ["trainer.use_v1=false"], None),
        ("engine", ["trainer.use_v1=true"], "0.9.0"),
    ],
)
def test_an_answer_names_each_key_its_verl_never_reads(profile, overrides, release):
    """Every key the audit calls unread on the run's path, set to its YAML default, is named in the memory answer
    as having no effect: labkit prices none of what that verl ignores."""

    def config(items):
        cfg = load_config(None, items, profile=profile, lenient=True)
        return apply_release(cfg, RELEASES[release]) if release else cfg

    run = Run.resolve(config(overrides))
    path = next(p for p in scan.PATHS if p.name == run.audit_path)
    root = scan.oracle_root(path)
    if root is None:
        pytest.skip(f"verl {path.release} is not installed")
    tree = OmegaConf.load(root / "verl" / "trainer" / "config" / path.yaml)
    keys = [k for k in scan.yaml_keys(root, path.yaml) if never_read(k, run.audit_path) is not None]
    assert keys
    settable = []
    for key in keys:
        value = OmegaConf.select(tree, key)
        shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        settable.append(f"{key}={shown}")
    cfg = config([*overrides, *settable])
    report = memory_report(cfg, MemorySettings.from_config(cfg, "Qwen2.5-7B", 80 * 2**30))
    named = {i["key"]: i["effect"] for i in report.not_priced}
    assert {k: named.get(k) for k in keys} == dict.fromkeys(keys, "no_effect")


def test_a_release_not_audited_is_never_called_unread():
    """0.6 was not audited: the same key that 0.7's answer calls unread is not named so under 0.6."""
    over = ["actor_rollout_ref.rollout.over_sample_rate=0.1"]
    named = {}
    for release in ("0.7", "0.6"):
        cfg = apply_release(load_config(None, over, profile="legacy", lenient=True), RELEASES[release])
        assert (Run.resolve(cfg).audit_path is None) == (release == "0.6")
        report = memory_report(cfg, MemorySettings.from_config(cfg, "Qwen2.5-7B", 80 * 2**30))
        named[release] = {i["key"]: i["effect"] for i in report.not_priced}.get(
            "actor_rollout_ref.rollout.over_sample_rate"
        )
    assert named == {"0.7": "no_effect", "0.6": None}


def _mixer_patches(root: Path) -> set[str]:
    """The model types whose branch of ``apply_monkey_patch`` replaces a gated delta-net's or Mamba mixer's
    forward."""
    tree = ast.parse((root / "verl" / "models" / "transformers" / "monkey_patch.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "apply_monkey_patch")
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and "model_type" in ast.unparse(node.test):
            types = {c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            assigned = {
                ast.unparse(t) for n in node.body for a in ast.walk(n) if isinstance(a, ast.Assign) for t in a.targets
            }
            if any(t.endswith(".forward") and ("DeltaNet" in t or "Mamba" in t) for t in assigned):
                out |= {t for t in types if "." not in t}
    return out


def test_the_ulysses_patch_of_each_release_reaches_the_mixers_the_table_says():
    for release in {p.release for p in _installed()}:
        root = scan.oracle_root(next(p for p in scan.PATHS if p.release == release))
        assert _mixer_patches(root) == set(SP_MIXER_PATCHES[release]), release


@pytest.mark.parametrize(
    ("model", "args", "named"),
    [
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", {}, True),  # no release patches its gated delta-net
        ("Qwen/Qwen3.5-27B", {}, False),  # 0.9.1 does
        ("Qwen/Qwen3.5-27B", {"profile": "legacy"}, True),  # 0.7.1 does not
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", {}, True),  # Mamba2
        ("Qwen/Qwen2.5-7B", {"profile": "legacy"}, False),  # attention only
    ],
)
def test_check_names_a_ulysses_size_that_misses_a_sequence_mixer(model, args, named):
    over = [f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.use_dynamic_bsz=true"]
    for sp in (1, 2):
        cfg = load_config(None, [*over, f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}"], **args)
        found = [f for f in check(cfg, fixes=False, **check_shape(cfg)).findings if f.code == "S10"]
        assert len(found) == (1 if named and sp > 1 else 0), (model, sp)
    megatron = load_config(None, [*over, "actor_rollout_ref.actor.strategy=megatron"])
    assert not [f for f in check(megatron, fixes=False, **check_shape(megatron)).findings if f.code == "S10"]
