"""Ask ``labkit memory`` about a case as its user would: the run's command as a launch script (verl's entry point and
the arguments it was given), the card (``--gpu`` or the capacity torch reported), the release (``--verl``), and
``--json``; the answer is what the command prints and its exit code, nothing else.
"""

from __future__ import annotations

import io
import json
import shlex
import tempfile
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit import cli
from labkit.reality.case import Case

ENTRY = "python3 -m verl.trainer.main_ppo"


@dataclass(frozen=True)
class Answer:
    """What ``labkit memory SCRIPT OPTIONS --json`` answered: exit code, the JSON report (exit 0 or 1), stderr."""

    options: tuple[str, ...]
    """The options after the script (``--gpu H100-80GB --verl 0.4 ...``)."""
    script: str
    exit_code: int
    report: dict[str, Any] | None
    stderr: str

    @property
    def refusal(self) -> str | None:
        """labkit's one-line refusal (exit 2: it cannot read the input; 3: an internal error), else None."""
        if self.exit_code in (0, 1):
            return None
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else f"exit code {self.exit_code}"

    def command(self, script_name: str = "run.sh") -> str:
        """The command line a user types, the script saved as ``script_name``."""
        return shlex.join(["labkit", "memory", script_name, *self.options])


def _shell_word(item: str) -> str:
    """One argument as a script writes it: quoted, with ``$`` left to the shell (an unresolved variable stays one)."""
    if "$" not in item:
        return shlex.quote(item)
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'


def launch_script(case: Case) -> str:
    """The run's command: verl's entry point and every argument (``Case.arguments``), one per line."""
    return " \\\n  ".join([ENTRY, *(_shell_word(a) for a in case.arguments)]) + "\n"


def options(case: Case, extra: Sequence[str] = ()) -> list[str]:
    """``labkit memory``'s options for the case: the capacity torch reported (else the card's preset), the release."""
    gpu = ["--gpu-memory", f"{case.capacity_gib}GiB"] if case.capacity_gib else ["--gpu", str(case.gpu_preset)]
    lengths = case.expected_lengths
    return [*gpu, "--verl", case.verl, *(["--lengths", lengths[0]] if lengths else []), *extra, "--json"]


def ask(case: Case, extra: Sequence[str] = ()) -> Answer:
    """Run ``labkit memory`` in this process on the case's launch script (written to a temporary folder)."""
    script = launch_script(case)
    opts = options(case, extra)
    with tempfile.TemporaryDirectory(prefix="labkit-reality-") as tmp:
        path = Path(tmp) / f"{case.id}.sh"
        path.write_text(script)
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = cli.main(["memory", str(path), *opts])
    text = out.getvalue().strip()
    report = json.loads(text) if code in (0, 1) and text.startswith("{") else None
    return Answer(tuple(opts), script, code, report, err.getvalue().replace(str(path), f"{case.id}.sh"))
