"""CI executes every notebook headless with papermill (INTERACTIVE=False); a notebook's own asserts are its tests.

Cells that demonstrate one of verl's errors carry the ``raises-exception`` tag, so the expected error is shown
and the run still passes; any other error fails the test.
"""

import json
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


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
        pm.execute_notebook(str(path), str(tmp_path / path.name), parameters={"INTERACTIVE": False},
                            kernel_name="python3", cwd=str(ROOT / "notebooks"), progress_bar=False,
                            execution_timeout=300)
    except pm.PapermillExecutionError:
        pass  # papermill reports even expected errors; every error cell is checked for its tag below
    elapsed = time.perf_counter() - start
    print(f"{path.name}: {elapsed:.1f} s")
    out = json.loads((tmp_path / path.name).read_text())
    code = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), "a cell did not run (execution stopped early)"
    for cell in code:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            assert "raises-exception" in cell["metadata"].get("tags", []), errors[0]["evalue"]
