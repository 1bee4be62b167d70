"""Every notebook runs clean under plain ``papermill IN OUT`` (exit 0), with its defaults and with a second parameter
set; a notebook's own asserts are its tests.

A cell that demonstrates one of verl's errors runs it inside ``labkit.ui.verdict.expect_verl_error(code)``: the
card replaces the traceback and the cell asserts the code, so nothing raises (papermill's CLI exits 1 on any error,
tagged or not). Each executed notebook must show, in order, one expected-error card per ``expect_verl_error("...")``
in its source, and those codes must be the ones it promises (``PROMISED``): a demonstration that stops raising fails
its cell, one that is deleted or changes code fails here.

The default run is the user's command (the CLI, in the repository root, ``INTERACTIVE`` as the notebook sets it).
The notebooks that start no process (``ARITHMETIC``) run it ``LABKIT_STRESS_RUNS`` times (2 in the suite), each
bounded by ``RUN_BOUND_S``: they used to hang about one run in six under papermill, in the cell that displays a
panel (``labkit.ui.widget_outputs`` says why and how panels avoid it); they also pass ``pytest --nbval-lax``.
The second set (``SECOND``) changes a world size, a profile or a loop and runs with ``INTERACTIVE=False``. Cost: the
suite runs the second set of the arithmetic notebooks (``SECOND_IN_SUITE``, ~10-20 s each); the live notebooks'
second sets start worker groups again (50-80 s each on 2 busy cores) and run with ``LABKIT_NOTEBOOKS=all``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# the second parameter set of each notebook: another world size, profile or loop (and smaller live runs)
SECOND: dict[str, dict] = {
    "00_start_here": {"PROFILE": "legacy", "LENGTHS": "long-reasoning"},
    "01_four_layers": {"PROFILE": "engine"},  # verl 0.9.1, v1 loop
    "02_rollout_and_dispatch": {
        "W": 2,
        "TP": 2,
        "N_PROMPTS": 4,
        "N": 2,
        "NEW_TOKENS": 8,
        "DISPATCH": "all_gather",
        "LAUNCHER": "local",
        "ENGINE": "hf",
    },
    "03_micro_batches": {"RANKS": 8, "SP": 2, "PROFILE": "engine"},
    "04_balance_batch": {"RANKS": 8, "SP": 2, "N_PROMPTS": 32},
    "05_remove_padding_and_ulysses": {"SP": 4},
    "06_live_step": {"N": 2, "SP": 2, "DYNAMIC": True, "STEPS": 1, "LEARN_STEPS": 0},
    "07_oom_debugging": {"MODEL": "Qwen3-8B"},
    "08_hangs": {"TIMEOUT_S": 2.0, "DRAWS": 20, "REAL_FSDP": False},
    "09_seed_claims": {"POSTS": [2], "NOTES": False},  # run by tests/test_seed_claims.py
    "10_loops_and_versions": {"LENGTHS": "long-reasoning", "SEED": 1},
    "11_rollout_engine": {"SEED": 1, "N": 2},
    "12_megatron": {"LENGTHS": "gsm8k-like", "LIVE_MICRO_BATCHES": 6, "TIMEOUT_S": 2.0},
}
# the notebooks whose second set the suite runs: pure arithmetic, no worker group to start again
SECOND_IN_SUITE = {"00_start_here", "01_four_layers", "03_micro_batches", "04_balance_batch", "10_loops_and_versions"}
# the verl errors each notebook demonstrates, in order
PROMISED: dict[str, list[str]] = {
    "01_four_layers": ["E1", "E21", "E23"],
    "03_micro_batches": ["E32", "E35", "E31", "E31"],
    "04_balance_batch": ["E38", "E36"],
    "05_remove_padding_and_ulysses": ["E41", "E42"],
}
EXPECT_CALL = re.compile(r"expect_verl_error\(\s*\"(\w+)\"")
PARAM_LINE = re.compile(r"^([A-Z_][A-Z0-9_]*(?:\s*,\s*[A-Z_][A-Z0-9_]*)*)\s*=", re.M)
EXPECTED_CARD = re.compile(r"data-verl-code='(\w+)' data-verl-expected='true'")
TIMEOUT_S = 600
# the notebooks that start no process: pure arithmetic, widgets and figures (seconds each)
ARITHMETIC = {"00_start_here", "01_four_layers", "03_micro_batches", "04_balance_batch", "10_loops_and_versions"}
STRESS_RUNS = int(os.environ.get("LABKIT_STRESS_RUNS", "2"))
RUN_BOUND_S = 300  # one run of an arithmetic notebook: 4-8 s quiet, 35 s on 2 busy cores, kernel start-up up to
# 180 s beside a second suite; a hang is cut here
# jupyter_client picks a free TCP port, then the kernel binds it: another kernel starting on the machine in between
# takes it first, and the kernel dies at start-up before running a cell. That start (nothing ran) is retried once.
PORT_RACE = ("Address already in use", "Kernel died before replying to kernel_info")


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def expected_in_source(nb: dict) -> list[str]:
    """The codes of the ``expect_verl_error("...")`` blocks, in cell order."""
    return [code for c in code_cells(nb) for code in EXPECT_CALL.findall("".join(c["source"]))]


def expected_in_outputs(nb: dict) -> list[str]:
    """The codes of the expected-error cards an executed notebook shows, in output order."""
    out = []
    for c in code_cells(nb):
        for o in c.get("outputs", []):
            html = "".join(o.get("data", {}).get("text/html", ""))
            out += EXPECTED_CARD.findall(html)
    return out


def check_executed(nb: dict, name: str) -> None:
    """Every code cell ran without an error output, and the notebook showed the errors it promises."""
    code = code_cells(nb)
    assert all(c.get("execution_count") for c in code), "a cell did not run (execution stopped early)"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, [(e["ename"], e["evalue"]) for e in errors]
    shown = expected_in_outputs(nb)
    assert shown == expected_in_source(nb), (shown, expected_in_source(nb))
    assert shown == PROMISED.get(name, []), (shown, PROMISED.get(name, []))


def parameters_cell(nb: dict) -> str:
    return "".join(code_cells(nb)[0]["source"])


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no numbered notebook"
    assert set(SECOND) == {p.stem for p in NOTEBOOKS}, "every notebook needs its second parameter set"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_conventions(path):
    """A parameters cell first (with INTERACTIVE and the second set's names), outputs stripped, labkit imported, no
    rank functions defined, no cell that raises on purpose, and the promised errors demonstrated in the source."""
    nb = json.loads(path.read_text())
    code = code_cells(nb)
    assert "parameters" in code[0]["metadata"].get("tags", []), "first code cell must be tagged 'parameters'"
    params = parameters_cell(nb)
    assert "INTERACTIVE" in params
    names = {n.strip() for m in PARAM_LINE.finditer(params) for n in m.group(1).split(",")}
    assert set(SECOND[path.stem]) <= names, f"the second set names no parameter: {set(SECOND[path.stem]) - names}"
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "strip outputs"
    src = "\n".join("".join(c["source"]) for c in code)
    assert "labkit" in src
    assert "def " not in src, "notebooks hold calls, not pipeline logic (define functions in labkit)"
    tagged = [c for c in nb["cells"] if "raises-exception" in c["metadata"].get("tags", [])]
    assert not tagged, "papermill's CLI exits 1 on any error: show it with labkit.ui.verdict.expect_verl_error"
    assert expected_in_source(nb) == PROMISED.get(path.stem, [])


def _papermill(path: Path, out: Path, parameters: dict | None, bound_s: float = TIMEOUT_S) -> float:
    """``python -m papermill IN OUT [-p NAME VALUE ...]`` from the repository root within ``bound_s``; its exit code
    must be 0 (a kernel that lost the start-up port race, ``PORT_RACE``, is started once more)."""
    # --start-timeout: a kernel importing labkit on cores shared with a second suite answered after more than
    # papermill's default 60 s; a hang is still cut by bound_s
    args = [sys.executable, "-m", "papermill", str(path), str(out), "--no-progress-bar", "--log-level", "ERROR"]
    args += ["--start-timeout", "180"]
    if parameters:
        args += ["-y", json.dumps(parameters)]  # JSON is YAML
    for attempt in (1, 2):
        start = time.perf_counter()
        try:
            done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=bound_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{path.name} did not finish within {bound_s:.0f} s under plain papermill (a hang)")
        elapsed = time.perf_counter() - start
        if done.returncode == 0 or attempt == 2 or not all(s in done.stderr for s in PORT_RACE):
            break
    assert done.returncode == 0, f"papermill exited {done.returncode}:\n{done.stderr[-4000:]}"
    return elapsed


@pytest.mark.notebook
@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_clean_under_papermill(path, tmp_path):
    """Plain ``papermill IN OUT`` exits 0 (``STRESS_RUNS`` times for an arithmetic notebook, each within
    ``RUN_BOUND_S``), then again with the second parameter set (and INTERACTIVE=False)."""
    arithmetic = path.stem in ARITHMETIC
    runs = [(f"defaults {k + 1}", None) for k in range(STRESS_RUNS if arithmetic else 1)]
    if path.stem in SECOND_IN_SUITE or os.environ.get("LABKIT_NOTEBOOKS") == "all":
        runs.append(("second set", {**SECOND[path.stem], "INTERACTIVE": False}))
    times = []
    for label, params in runs:
        out = tmp_path / f"{label.replace(' ', '_')}_{path.name}"
        times.append(f"{label} {_papermill(path, out, params, RUN_BOUND_S if arithmetic else TIMEOUT_S):.1f} s")
        check_executed(json.loads(out.read_text()), path.stem)
    print(f"{path.name}: {', '.join(times)}")


@pytest.mark.notebook
@pytest.mark.timeout(2 * TIMEOUT_S)
def test_arithmetic_notebooks_pass_nbval_lax():
    """``pytest --nbval-lax`` (nbval's own kernel client, every cell must run without an error) on the notebooks
    that start no process."""
    paths = [str(p) for p in NOTEBOOKS if p.stem in ARITHMETIC]
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--nbval-lax", *paths]
    args += ["--nbval-cell-timeout", str(RUN_BOUND_S), "-o", "addopts=", "--timeout", str(TIMEOUT_S)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=2 * TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\b[1-9]\d* passed", done.stdout) and " failed" not in done.stdout, done.stdout[-2000:]
    print(done.stdout.strip().splitlines()[-1])


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT_S)
def test_megatron_notebook_passes_nbval_lax_without_its_live_part():
    """12 under ``pytest --nbval-lax`` (nbval's own kernel client): its arithmetic sections run as written; nbval
    takes no parameters, so ``LABKIT_LIVE=0`` makes the live sections (4 rank processes) a no-op there (papermill
    runs them)."""
    path = ROOT / "notebooks" / "12_megatron.ipynb"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--nbval-lax", str(path)]
    args += ["--nbval-cell-timeout", str(RUN_BOUND_S), "-o", "addopts=", "--timeout", str(TIMEOUT_S)]
    env = {**os.environ, "LABKIT_LIVE": "0"}
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=2 * TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\b[1-9]\d* passed", done.stdout) and " failed" not in done.stdout, done.stdout[-2000:]


def _cell(source="x", outputs=(), count=1):
    return {"cell_type": "code", "metadata": {}, "source": [source], "execution_count": count, "outputs": list(outputs)}


def _card(code):
    html = f"<div class='labkit-verdict' data-verl-code='{code}' data-verl-expected='true'>…</div>"
    return {"output_type": "display_data", "data": {"text/html": html, "text/plain": code}, "metadata": {}}


def test_executed_check_catches_a_missing_or_changed_demonstration():
    """The check test_notebook_runs_clean_under_papermill applies, on synthetic executed cells (no kernel needed)."""
    src = 'with expect_verl_error("E38"):\n    raise_for(odd)'
    ok = {"cells": [_cell("P"), _cell(src, [_card("E38")]), _cell('with expect_verl_error( "E36"):', [_card("E36")])]}
    check_executed(ok, "04_balance_batch")
    with pytest.raises(AssertionError, match="E36"):  # a promised demonstration was deleted
        check_executed({"cells": ok["cells"][:2]}, "04_balance_batch")
    with pytest.raises(AssertionError):  # a card of another code than the source asks for
        check_executed({"cells": [_cell(src, [_card("E26")]), ok["cells"][2]]}, "04_balance_batch")
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        error = {"output_type": "error", "ename": "ZeroDivisionError", "evalue": "x", "traceback": []}
        check_executed({"cells": [_cell(outputs=[error])]}, "10_loops_and_versions")
    with pytest.raises(AssertionError, match="did not run"):
        check_executed({"cells": [_cell(), _cell(count=None)]}, "10_loops_and_versions")
    # an OK card or a card shown with show_verdict is not an expected error
    plain = {"output_type": "display_data", "data": {"text/html": "<div data-verl-code='E21'>"}, "metadata": {}}
    assert expected_in_outputs({"cells": [_cell(outputs=[plain])]}) == []
