"""The notebook suite as data: every notebook with what it teaches, which one explains each part of the start-here
dashboard, and which one demonstrates each error code, so the dashboard can link a verdict or a figure to its lesson.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"


@dataclass(frozen=True)
class Notebook:
    """One notebook of the suite: its file stem (``03_micro_batches``), a short title and what it teaches."""

    stem: str
    title: str
    teaches: str

    @property
    def file(self) -> str:
        return f"{self.stem}.ipynb"

    @property
    def exists(self) -> bool:
        return (NOTEBOOK_DIR / self.file).is_file()

    def link_html(self) -> str:
        """An HTML link relative to notebooks/ (JupyterLab opens it), or the title marked "coming" when absent."""
        label = html.escape(f"{self.stem[:2]} · {self.title}")
        if not self.exists:
            return f"<span title='not written yet'>{label} (coming)</span>"
        return f"<a href='{html.escape(self.file)}' target='_blank' style='color:#1a6fb0'>{label}</a>"


NOTEBOOKS = [
    Notebook("01_four_layers", "Four layers", "from train_batch_size to what each GPU holds; verl's batch checks"),
    Notebook("02_rollout_and_dispatch", "Rollout and dispatch", "who generates what: replicas, TP groups, dispatch"),
    Notebook("03_micro_batches", "Micro-batches", "static micro-batches or a token budget (dynamic batch size)"),
    Notebook("04_balance_batch", "_balance_batch", "which rows each DP rank gets, and how even the work is"),
    Notebook("05_remove_padding_and_ulysses", "Remove padding and Ulysses", "packed rows, sequence parallelism"),
    Notebook("06_live_step", "A live GRPO step", "a whole step on real processes, checked against the plan"),
    Notebook("07_oom_debugging", "Why did it OOM?", "memory per phase, the first phase over the GPU, the fixes"),
    Notebook("08_hangs", "Hangs", "reproduce the batch-size hangs, read them rank by rank, predict them"),
    Notebook(
        "09_seed_claims", "The claims, executed", "every claim of the two blog posts behind the lab, checked by labkit"
    ),
    Notebook("10_loops_and_versions", "Loops and versions", "legacy, engine-v0 and engine-v1 on the same config"),
    Notebook("11_rollout_engine", "The rollout engine", "vLLM as verl runs it: one engine per TP group"),
    Notebook(
        "12_megatron", "Megatron, stage by stage", "ranks, micro-batches, the pipeline schedule, memory per stage"
    ),
]
BY_STEM = {nb.stem: nb for nb in NOTEBOOKS}

# which notebook explains each part of the dashboard
PANELS = {
    "verdict": ("01_four_layers", "10_loops_and_versions"),
    "pipeline": ("01_four_layers", "02_rollout_and_dispatch", "10_loops_and_versions", "12_megatron"),
    "ranks": ("03_micro_batches", "04_balance_batch", "05_remove_padding_and_ulysses"),
    "memory": ("07_oom_debugging",),
    "hangs": ("08_hangs",),
}

# the notebook that demonstrates an error code (codes not listed: 01, which walks verl's checks in order)
_CODE_GROUPS = {
    "02_rollout_and_dispatch": "E2 E23 E24 E25",
    "03_micro_batches": "E3 E4 E6 E7 E10 E11 E13 E14 E22 E30 E31 E32 E33 E34 E35 E39 B1 B2 B3 X1 X3 S3 S4",
    "04_balance_batch": "E36 E37 E38 E40",
    "05_remove_padding_and_ulysses": "E12 E18 E41 E42 X4",
    "08_hangs": "X2",
    "12_megatron": "M21",
    "10_loops_and_versions": "E28 E46 E47 E48 E49 E50 E51 E52 E53 E54 E55 E56 E57 B4 X6 S5 S6 N6 N7 N8 N9",
}
CODE_NOTEBOOK = {code: stem for stem, codes in _CODE_GROUPS.items() for code in codes.split()}


def notebook_for_code(code: str | None) -> Notebook:
    """The notebook that shows an error code (01 by default)."""
    return BY_STEM[CODE_NOTEBOOK.get(code or "", "01_four_layers")]


def panel_links(panel: str) -> str:
    """ "explained in: 03 · Micro-batches, 04 · ..." for one dashboard panel, as HTML."""
    return "explained in " + ", ".join(BY_STEM[s].link_html() for s in PANELS[panel])
