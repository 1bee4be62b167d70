"""Which keys of verl's trainer YAML the code a run executes never reads, per release, loop and engine: the audit
behind ``data/unread_keys.yaml`` (``tests/test_unread_keys.py`` runs it on the installed verl oracles).

A run's code is the import closure of ``verl/trainer/main_ppo.py`` and of the YAML's ``_target_`` classes, less the
modules and classes of the paths it does not take (the other loop, the other engine, the legacy or engine workers).
A key is read on a path when its last name appears there as an attribute (``config.actor.ppo_epochs``) or a string
(``config.get("ppo_epochs")``, ``"actor.ppo_epochs"``), docstrings aside, or when a key read there takes its value
from it (``${oc.select:data.max_response_length,512}``). The scan is by name, so it errs one way: a
name read anywhere on the path counts as read for every key that ends in it. What it reports is exact in the other
direction: no code on that path names the key.

    python scripts/verl_key_reads.py   # per path: how many keys are unread, and those data/unread_keys.yaml lacks
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OTHER_ENGINES = ("verl.workers.engine.veomni*", "verl.workers.engine.torchtitan*", "verl.workers.engine.automodel*",
                 "verl.workers.engine.mindspeed*", "verl.workers.engine_workers_tinker*")  # fmt: skip
MEGATRON_ONLY = ("verl.workers.megatron_workers", "verl.workers.engine.megatron*", "verl.workers.actor.megatron_actor",
                 "verl.workers.critic.megatron_critic", "verl.models.mcore*", "verl.utils.megatron*")  # fmt: skip
FSDP_ONLY = ("verl.workers.fsdp_workers", "verl.workers.engine.fsdp*", "verl.workers.actor.dp_actor",
             "verl.workers.critic.dp_critic", "verl.utils.fsdp_utils")  # fmt: skip
LEGACY_ONLY = ("verl.workers.fsdp_workers", "verl.workers.megatron_workers", "verl.workers.actor*",
               "verl.workers.critic*", "verl.workers.sharding_manager*")  # fmt: skip
ENGINE_ONLY = ("verl.workers.engine_workers", "verl.workers.engine.fsdp.transformer_impl",
               "verl.workers.engine.megatron.transformer_impl", "verl.workers.engine.base")  # fmt: skip
V1_ONLY = ("verl.trainer.ppo.v1*",)
V0_ONLY = ("verl.trainer.main_ppo_v0", "verl.trainer.ppo.ray_trainer::RayPPOTrainer")


@dataclass(frozen=True)
class RunPath:
    """One way verl runs a PPO step: a release, its trainer loop and its engine, and the code it leaves out."""

    release: str
    loop: str
    """``legacy`` (the legacy workers and the v0 loop), ``v0`` or ``v1`` (the engine workers)."""
    engine: str
    """``fsdp`` or ``megatron``."""
    oracle: str
    """Where that release is installed, from the repository root (``site`` for the venv's verl)."""

    @property
    def name(self) -> str:
        return f"{self.release} {self.loop} {self.engine}"

    @property
    def yaml(self) -> str:
        return "_generated_ppo_trainer.yaml" if self.engine == "fsdp" else "_generated_ppo_megatron_trainer.yaml"

    @property
    def left_out(self) -> tuple[str, ...]:
        engine = MEGATRON_ONLY if self.engine == "fsdp" else FSDP_ONLY
        loop = {"legacy": ENGINE_ONLY + V1_ONLY, "v0": LEGACY_ONLY + V1_ONLY, "v1": LEGACY_ONLY + V0_ONLY}[self.loop]
        return OTHER_ENGINES + engine + loop


PATHS = tuple(
    RunPath(release, loop, engine, oracle)
    for release, loops, oracle in (
        ("0.7.1", ("legacy",), ".oracle/verl-0.7.1"),
        ("0.8.0", ("v0",), ".oracle/verl-0.8.0"),
        ("0.9.0", ("v0", "v1"), ".oracle/verl-0.9.0"),
        ("0.9.1", ("v0", "v1"), "site"),
    )
    for loop in loops
    for engine in ("fsdp", "megatron")
)
"""The paths labkit models: 0.7 runs the legacy workers, 0.8.0 the engine workers with the v0 loop, 0.9.x either loop."""


def site_root() -> Path | None:
    """The folder holding the venv's verl (0.9.1), or None when it is not installed."""
    try:
        import verl
    except ImportError:
        return None
    return Path(verl.__file__).resolve().parents[1]


def oracle_root(path: RunPath) -> Path | None:
    root = site_root() if path.oracle == "site" else ROOT / path.oracle
    return root if root is not None and (root / "verl").is_dir() else None


def _leaves(node, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, value in node.items() for k in _leaves(value, f"{prefix}.{key}" if prefix else str(key))]
    return [prefix]


def yaml_keys(root: Path, name: str) -> set[str]:
    """Every leaf key of a release's generated trainer YAML (hydra's own and ``defaults`` aside)."""
    tree = yaml.safe_load((root / "verl" / "trainer" / "config" / name).read_text())
    return {k for k in _leaves(tree) if not k.startswith("hydra") and k != "defaults"}


def interpolations(root: Path, name: str) -> dict[str, set[str]]:
    """For each key of the YAML, the keys whose value it takes (``${oc.select:data.max_response_length,512}``)."""
    tree = yaml.safe_load((root / "verl" / "trainer" / "config" / name).read_text())
    out: dict[str, set[str]] = {}
    for key in _leaves(tree):
        value = tree
        for part in key.split("."):
            value = value[part] if isinstance(value, dict) and part in value else None
        if isinstance(value, str):
            words = {w for inner in re.findall(r"\$\{([^}]*)\}", value) for w in re.split(r"[:,\s]+", inner)}
            out[key] = {w.lstrip(".") for w in words if w}
    return out


def _module_file(root: Path, module: str) -> Path | None:
    base = root / Path(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.exists():
            return candidate
    return None


@cache
def _parsed(file: Path) -> ast.Module:
    return ast.parse(file.read_text(), str(file))


def _imports(tree: ast.Module, module: str, is_package: bool) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(parts + ([base] if base else []))
            out += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return out


def _left_out(name: str, left_out: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in left_out)


def reachable(root: Path, left_out: tuple[str, ...] = ()) -> dict[str, Path]:
    """verl's modules a PPO run can import: the closure of main_ppo's and the YAMLs' ``_target_`` imports, anywhere
    in a module (imports inside functions included), never entering a left-out module."""
    config = root / "verl" / "trainer" / "config"
    targets = {
        t.rsplit(".", 1)[0] for p in config.rglob("*.yaml") for t in re.findall(r"_target_:\s*([\w.]+)", p.read_text())
    }
    todo = ["verl.trainer.main_ppo", *sorted(targets)]
    seen: dict[str, Path] = {}
    while todo:
        module = todo.pop()
        if module in seen or not module.startswith("verl.") or _left_out(module, left_out):
            continue
        file = _module_file(root, module)
        if file is None:
            continue
        seen[module] = file
        todo += _imports(_parsed(file), module, file.name == "__init__.py")
    return seen


def _docstrings(tree: ast.Module) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip


def _names(node: ast.AST, docstrings: set[int]) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif (
            isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings and len(n.value) < 200
        ):
            out.update(n.value.split("."))
    return out


@cache
def names_read(root: Path, left_out: tuple[str, ...]) -> frozenset[str]:
    """Every attribute and string name in the code a path runs (left-out classes and functions skipped)."""
    out: set[str] = set()
    for module, file in reachable(root, left_out).items():
        tree = _parsed(file)
        docstrings = _docstrings(tree)
        for statement in tree.body:
            unit = getattr(statement, "name", None)
            if unit is not None and _left_out(f"{module}::{unit}", left_out):
                continue
            out |= _names(statement, docstrings)
    return frozenset(out)


def unread(path: RunPath) -> list[str]:
    """The keys of the path's YAML whose last name no code on the path reads, nor any key read there that takes its
    value from them."""
    root = oracle_root(path)
    if root is None:
        raise FileNotFoundError(f"verl {path.release} is not installed ({path.oracle})")
    names = names_read(root, path.left_out)
    keys = yaml_keys(root, path.yaml)
    read = {k for k in keys if k.rsplit(".", 1)[-1] in names}
    takes = interpolations(root, path.yaml)
    while True:  # a key another read key takes its value from is read through it
        through = {source for key in read for source in takes.get(key, ())} - read
        if not through:
            return sorted(keys - read)
        read |= through


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from labkit.config.unread_keys import audit_entry

    for path in PATHS:
        if oracle_root(path) is None:
            print(f"== {path.name}: not installed")
            continue
        keys = unread(path)
        loose = [k for k in keys if audit_entry(k, path.name) is None]
        print(f"== {path.name}: {len(keys)} unread, {len(loose)} not in data/unread_keys.yaml")
        for key in loose:
            print("  ", key)


if __name__ == "__main__":
    main()
