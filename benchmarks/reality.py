"""The agreement report: every case of the reality corpus (data/reality) asked of `labkit memory` as its user would
ask it, one line per case and the totals.

    .venv/bin/python benchmarks/reality.py                 # every case, the totals, the README table
    .venv/bin/python benchmarks/reality.py --case ID       # one case: its command, labkit's answer, what happened
    .venv/bin/python benchmarks/reality.py --confidence high,medium

Known disagreements, each with its cause or "not yet understood", are listed in benchmarks/reality_known.yaml; the
suite (tests/test_reality.py) fails when a case leaves or joins them unannounced.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

from labkit.reality.corpus import case, load_corpus
from labkit.reality.report import case_line, known_disagreements, markdown_table, totals_lines
from labkit.reality.score import score, totals


def _one(case_id: str) -> int:
    s = score(case(case_id))
    print(f"{s.case.id}: {s.case.summary}")
    print(f"source: {s.case.url}")
    print(f"release: verl {s.case.verl} ({s.case.release_basis})")
    print(f"command: {s.answer.command(s.case.id + '.sh')}")
    print(s.answer.script, end="")
    print(case_line(s))
    if s.answer.stderr.strip():
        print("labkit said on stderr:\n  " + "\n  ".join(s.answer.stderr.strip().splitlines()))
    known = known_disagreements().get(s.case.id)
    if known:
        print(f"known disagreement ({known['verdict']}): {known['cause']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", help="one case, in full")
    p.add_argument("--confidence", default="high,medium,low", help="which confidences to list (comma-separated)")
    p.add_argument("--readme", action="store_true", help="also write the totals into README.md's reality section")
    ns = p.parse_args(argv)
    if ns.case:
        return _one(ns.case)
    keep = set(ns.confidence.split(","))
    start = time.perf_counter()
    scores = [score(c) for c in load_corpus() if c.confidence in keep]
    elapsed = time.perf_counter() - start
    known = known_disagreements()
    for s in scores:
        cause = known.get(s.case.id, {}).get("cause")
        print(case_line(s) + (f"\n    cause: {cause}" if cause and s.agreement != "agree" else ""))
    print()
    t = totals(scores)
    print("\n".join(totals_lines(t)))
    print(f"({len(scores)} cases asked in {elapsed:.1f} s)")
    print()
    table = markdown_table(t, datetime.date.today().isoformat())
    print(table)
    if ns.readme:
        write_readme(table)
    return 0


README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "<!-- section: reality -->"


def write_readme(table: str) -> None:
    """Replace the table of README.md's reality section (between its markers) with today's."""
    text = README.read_text()
    start = text.index(SECTION)
    end = text.index("<!-- end section -->", start)
    body = text[start:end]
    first = body.index("| measured")
    last = first
    lines = body[first:].split("\n")
    while lines and (lines[0].startswith("|") or (lines[0] == "" and len(lines) > 1 and lines[1].startswith("|"))):
        last += len(lines.pop(0)) + 1
    README.write_text(text[: start + first] + table + "\n" + body[last:] + text[end:])


if __name__ == "__main__":
    sys.exit(main())
