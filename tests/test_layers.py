"""The architecture in the tree: the layer contract (import-linter, configured in pyproject.toml) holds, it would
fail on an upward import or a cycle, and every ``labkit.…`` path written as a string or in a docstring resolves."""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
DOTTED = re.compile(r"\blabkit(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?::[A-Za-z_][A-Za-z0-9_.]*)?")


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_layer_contract_and_no_cycles():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


@pytest.mark.parametrize(
    "module, line, broken",
    [
        (
            "config/lengths.py",
            "from labkit.plan.step import plan",
            "labkit.config is not allowed to import labkit.plan",
        ),
        ("rl/actor_record.py", "from labkit.rl.actor import ActorWorker", "No cycles are allowed in labkit.rl"),
    ],
)
def test_contract_fails_on_upward_import_or_cycle(tmp_path, module, line, broken):
    shutil.copytree(ROOT / "labkit", tmp_path / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "labkit" / module, "a") as fh:
        fh.write(f"\n{line}\n")
    out = _lint(tmp_path)
    assert out.returncode != 0 and broken in out.stdout, out.stdout + out.stderr


def _references() -> set[tuple[str, str]]:
    """Every labkit.… path in string literals and docstrings of labkit, tests, benchmarks and scripts."""
    refs = set()
    for folder in ("labkit", "tests", "benchmarks", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    refs.update((m, str(path.relative_to(ROOT))) for m in DOTTED.findall(node.value))
    return refs


def _resolves(ref: str) -> bool:
    name, _, attr = ref.partition(":")
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        try:
            for a in parts[cut:] + (attr.split(".") if attr else []):
                obj = getattr(obj, a)
        except AttributeError:
            return False
        return True
    return False


def test_module_paths_in_strings_resolve():
    refs = _references()
    assert any(ref == "labkit.runtime.rank_host" for ref, _ in refs)  # the launcher's preload list is seen
    bad = sorted(f"{where}: {ref}" for ref, where in refs if not _resolves(ref.rstrip(".")))
    assert not bad, "unresolved labkit paths:\n" + "\n".join(bad)


def test_tree_shows_the_layers():
    """Only the package and the shared record at the top (the command line is a package, one module per command);
    each subpackage's docstring names its layer and what it may import."""
    top = sorted(p.name for p in (ROOT / "labkit").glob("*.py"))
    assert top == ["__init__.py", "trace.py"], top
    for init in sorted((ROOT / "labkit").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "layer" in doc and "May import" in doc, f"{init.relative_to(ROOT)}: say the layer and what it may import"


MAX_MODULE_LINES = 300


def test_every_module_is_small():
    """One idea a module: none of labkit's modules is over 300 lines."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / "labkit").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, long
