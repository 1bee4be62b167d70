"""The error catalogue: every code labkit shows, as data (``data/error_catalogue.yaml``).

Each entry has verl's message template verbatim (``str.format`` fields where verl formats a value; ``also``: the
other texts of the same code), the exception type, where verl raises it (``file: function``) and in which versions,
when it fires (start-up, worker init, step 1; silent, notice, info), and a plain why. The rules that validate, the
planner, DataProto and the live actor share (E20–E22, E26–E31) format their texts here (``message``); every other text
labkit emits is checked against its template by tests/test_catalogue.py. ``docs/errors.md`` is rendered from the same
data (``render_markdown``), ``labkit explain CODE`` prints one entry (``render_text``).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

CATALOGUE_FILE = Path(__file__).resolve().parents[2] / "data" / "error_catalogue.yaml"
DOCS_FILE = "docs/errors.md"
WHEN = ("start-up", "worker init", "step 1", "silent", "notice", "info")
_WHEN_DOC = {
    "start-up": "Before any worker starts: verl's `validate_config` and the config dataclasses reject the config.",
    "worker init": "While a worker is built or initialised (`__init__`, `init_model`).",
    "step 1": "During the first training step: generation, balancing, dispatch, log-probs, updates.",
    "silent": "Nothing is raised, but verl does something you may not expect.",
    "notice": "A notice verl prints, or a condition labkit points out: one that may fail later, or a loop labkit "
    "does not model.",
    "info": "Information from labkit, never an error.",
}


@dataclass(frozen=True)
class CatalogueEntry:
    """One code: verl's message template, exception type, location, versions, when it fires and why."""

    code: str
    title: str
    template: str
    exc_type: str | None
    where: str
    versions: str
    when: str
    why: str
    also: tuple[str, ...] = ()  # other texts of the same code (another branch of the same check)
    v1: str = ""  # under verl 0.9.1's default v1 loop: "fires", "gone", "moves", "new" or "n/a", then why; "" = as v0

    def format(self, **fields: Any) -> str:
        """verl's message with ``fields`` filled in (KeyError names a missing field)."""
        return self.template.format(**fields)

    @property
    def templates(self) -> tuple[str, ...]:
        """The main template, then the ``also`` ones."""
        return (self.template, *self.also)

    @property
    def anchor(self) -> str:
        """The link to this entry's section of ``docs/errors.md``."""
        return f"{DOCS_FILE}#{self.code.lower()}"


@lru_cache(maxsize=1)
def catalogue() -> dict[str, CatalogueEntry]:
    """All entries by code, in the file's order (read with libyaml's loader where PyYAML has it: 10x faster, and the
    first answer that names a code pays for it)."""
    raw = yaml.load(CATALOGUE_FILE.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    out = {}
    for code, body in raw["codes"].items():
        entry = CatalogueEntry(code=code, **{**body, "also": tuple(body.get("also") or ())})
        if entry.when not in WHEN:
            raise ValueError(f"{CATALOGUE_FILE.name}: {code}: when must be one of {WHEN}, got {entry.when!r}")
        out[code] = entry
    return out


def entry(code: str) -> CatalogueEntry:
    """The entry of ``code``; KeyError with the known codes when there is none."""
    try:
        return catalogue()[code]
    except KeyError:
        raise KeyError(f"no catalogue entry {code!r}; known: {', '.join(catalogue())}") from None


def message(code: str, **fields: Any) -> str:
    """verl's text of ``code`` with its fields filled in."""
    return entry(code).format(**fields)


def _pattern(template: str) -> re.Pattern:
    """A template as a regex over whole messages: literal text, any value where a field goes."""
    parts = [
        re.escape(literal) + ("(.*?)" if field is not None else "")
        for literal, field, _, _ in string.Formatter().parse(template)
    ]
    return re.compile("".join(parts) + r"\Z", re.S)


@lru_cache(maxsize=1)
def _patterns() -> tuple[tuple[str, re.Pattern], ...]:
    return tuple((e.code, _pattern(t)) for e in catalogue().values() for t in e.templates)


def code_of(text: str, codes: tuple[str, ...] | None = None) -> str | None:
    """The code whose template produces ``text`` (among ``codes`` when given), or None."""
    return next((c for c, pat in _patterns() if (codes is None or c in codes) and pat.match(text)), None)


def message_fields(code: str, text: str) -> dict[str, str]:
    """The values verl formatted into ``text``, by field name, if ``text`` is one of ``code``'s messages; else {}."""
    for template in entry(code).templates:
        m = _pattern(template).match(text)
        if m:
            names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
            return dict(zip(names, m.groups()))
    return {}


def render_text(code: str) -> str:
    """One entry as plain text (``labkit explain CODE``)."""
    e = entry(code)
    lines = [f"{e.code}  {e.title}"]
    for i, t in enumerate(e.templates):
        lines.append(f"  {'message:' if i == 0 else 'or:':<10} {t or '(no message: a bare assert)'}")
    for name, value in (
        ("exception", e.exc_type or "none (verl raises nothing)"),
        ("where", e.where),
        ("versions", e.versions),
        ("when", e.when),
        ("v1 loop", e.v1 or "as in the v0 loop"),
        ("why", e.why),
        ("docs", e.anchor),
    ):
        lines.append(f"  {name + ':':<10} {value}")
    return "\n".join(lines)


_INTRO = """\
Every verdict labkit shows (`labkit check`, `labkit plan`, `labkit.validate.report.check`) carries a short code. The
section of each code below gives the message verl prints, verbatim (`{name}` marks a value verl formats into it),
the exception type, where in verl's source it is raised (`file: function`), the versions that have it, when it
fires, and why. `labkit explain CODE` prints the same entry in a terminal.

Codes: `E1`-`E45` are verl's own batch-size errors, `E46`-`E57` those of verl 0.9.1's v1 trainer loop; `B1`-`B4`
bare asserts (no message); `X1`-`X8` Python or torch errors verl's code runs into or raises without a message;
`S1`-`S10` silent behaviours; `N1`-`N9` printed notices and conditional failures; `GA` labkit information;
`F1`-`F13` facts of verl's code (where it implements a stage) that notebook 09 checks claims against; `M1`-`M25` the
Megatron backend's checks (verl's Megatron workers and megatron-core 0.16.1).

labkit models two profiles and three trainer loops: `legacy` = the workers of verl <= 0.7 (`fsdp_workers.py`,
`dp_actor.py`) with the `RayPPOTrainer` loop; `engine` = the engine workers of verl 0.9.1 (`engine_workers.py`)
with its default v1 loop (`trainer.use_v1=true`, `verl/trainer/ppo/v1`) or its v0 `RayPPOTrainer` loop
(`trainer.use_v1=false`). "all" under versions means both profiles; each entry says how the code behaves under
the v1 loop, and the table "Codes per trainer loop" below gathers the ones that differ.

This file is generated from `data/error_catalogue.yaml`: edit the YAML, then run
`python -m labkit.cli explain --markdown > docs/errors.md`.
"""


_LOOP_DOC = (
    "verl 0.9.1 runs the v1 loop by default: no driver-side repeat, the B prompts split unevenly over the agent "
    "loops, rows in completion order, synthetic padding rows up to a multiple of lcm(D, M x n, critic M x n), "
    "`_balance_batch` always on, dispatch through TransferQueue. Codes not listed behave as in the v0 loop "
    "(`trainer.use_v1=false`); `validate_config` runs before the loop is chosen, so every start-up check applies "
    "to both."
)


def render_markdown() -> str:
    """The content of ``docs/errors.md``: intro, contents by ``when``, one section per code."""
    by_when = {w: [e for e in catalogue().values() if e.when == w] for w in WHEN}
    out = ["# labkit error codes", "", _INTRO, "## Contents", ""]
    for w, entries in by_when.items():
        links = ", ".join(f"[{e.code}](#{e.code.lower()})" for e in entries)
        out.append(f"- [{w}](#{w.replace(' ', '-')}): {_WHEN_DOC[w]} {links}")
    out += ["", "## Codes per trainer loop", "", _LOOP_DOC, "", "| code | title | under the v1 loop |", "|---|---|---|"]
    for e in catalogue().values():
        if e.v1:
            out.append(f"| [{e.code}](#{e.code.lower()}) | {e.title} | {e.v1} |")
    for w, entries in by_when.items():
        out += ["", f"## {w}", "", _WHEN_DOC[w]]
        for e in entries:
            out += ["", f"### {e.code}", "", f"**{e.title}**", ""]
            for i, t in enumerate(e.templates):
                out += (["or:", ""] if i else []) + (
                    ["```text", t, "```", ""] if t else ["(no message: a bare `assert`)", ""]
                )
            out += [
                f"- exception: {f'`{e.exc_type}`' if e.exc_type else 'none (verl raises nothing)'}",
                f"- where: `{e.where}`",
                f"- versions: {e.versions}",
                f"- when: {e.when}",
                f"- under the v1 loop: {e.v1 or 'as in the v0 loop'}",
                "",
                e.why,
            ]
    return "\n".join(out) + "\n"
