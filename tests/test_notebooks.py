"""CI executes every notebook headless with papermill (INTERACTIVE=False); a notebook's own asserts are its tests.

Cells that demonstrate one of verl's errors carry the ``raises-exception`` tag, so the expected error is shown
and the run still passes; any other error fails the test, and so does a tagged cell that no longer raises (checked
on the same executed copy, so no notebook runs twice).
"""

import json
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TAG = "raises-exception"
# errors that mean the demonstration broke (a typo, a moved import), not the verl error it exists to show
PLUMBING = {
    "NameError",
    "ImportError",
    "ModuleNotFoundError",
    "AttributeError",
    "SyntaxError",
    "IndentationError",
    "KeyboardInterrupt",
    "CellTimeoutError",
    "DeadKernelError",
}


def check_executed_cells(cells: list[dict]) -> None:
    """The executed code cells of one notebook: every cell ran, an error only in a cell tagged ``raises-exception``,
    and every tagged cell really raised (an ``error`` output that is not a plumbing error)."""
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), "a cell did not run (execution stopped early)"
    for i, cell in enumerate(code):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        tagged = TAG in cell["metadata"].get("tags", [])
        src = "".join(cell["source"])[:120]
        if errors:
            assert tagged, errors[0]["evalue"]
            assert errors[0]["ename"] not in PLUMBING, (i, src, errors[0]["ename"], errors[0]["evalue"])
        else:
            assert not tagged, f"code cell {i} is tagged {TAG!r} but did not raise: {src!r}"


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no numbered notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_conventions(path):
    """A parameters cell first (with INTERACTIVE), outputs stripped, labkit imported, no rank functions defined."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0]["metadata"].get("tags", []), "first code cell must be tagged 'parameters'"
    assert "INTERACTIVE" in "".join(code[0]["source"])
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "strip outputs"
    src = "\n".join("".join(c["source"]) for c in code)
    assert "labkit" in src
    assert "def " not in src, "notebooks hold calls, not pipeline logic (define functions in labkit)"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless(path, tmp_path):
    import papermill as pm

    start = time.perf_counter()
    try:
        pm.execute_notebook(
            str(path),
            str(tmp_path / path.name),
            parameters={"INTERACTIVE": False},
            kernel_name="python3",
            cwd=str(ROOT / "notebooks"),
            progress_bar=False,
            execution_timeout=300,
        )
    except pm.PapermillExecutionError:
        pass  # papermill reports even expected errors; every error cell is checked for its tag below
    elapsed = time.perf_counter() - start
    print(f"{path.name}: {elapsed:.1f} s")
    check_executed_cells(json.loads((tmp_path / path.name).read_text())["cells"])


def _cell(tags=(), error=None, count=1):
    outputs = [{"output_type": "error", "ename": error[0], "evalue": error[1], "traceback": []}] if error else []
    return {
        "cell_type": "code",
        "metadata": {"tags": list(tags)},
        "source": ["x"],
        "execution_count": count,
        "outputs": outputs,
    }


def test_executed_cell_check_catches_a_tagged_cell_that_stops_raising():
    """The check test_notebook_runs_headless applies, on synthetic executed cells (no kernel needed)."""
    ok = [_cell(["parameters"]), _cell([TAG], ("AssertionError", "10 % 4 != 0")), _cell()]
    check_executed_cells(ok)
    with pytest.raises(AssertionError, match="tagged 'raises-exception' but did not raise"):
        check_executed_cells([_cell(["parameters"]), _cell([TAG]), _cell()])
    with pytest.raises(AssertionError, match="boom"):
        check_executed_cells([_cell(), _cell(error=("ValueError", "boom"))])  # an untagged error
    with pytest.raises(AssertionError, match="NameError"):
        check_executed_cells([_cell([TAG], ("NameError", "name 'raise_for' is not defined"))])
    with pytest.raises(AssertionError, match="did not run"):
        check_executed_cells([_cell(), _cell(count=None)])


def test_raises_exception_tags_are_on_code_cells():
    """Every tagged cell is a code cell (a tag on markdown would never be checked)."""
    tagged = 0
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            if TAG in cell["metadata"].get("tags", []):
                assert cell["cell_type"] == "code", (path.name, "".join(cell["source"])[:80])
                tagged += 1
    assert tagged >= 1
