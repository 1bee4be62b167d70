"""docs/memory_keys.md: every verl key by its memory effect, generated from ``data/key_effects.yaml`` (a test checks
the page matches): the keys labkit prices, those it names as not priced with what each would change, those verl
reads and ignores, and those with no GPU-memory effect with why."""

from __future__ import annotations

import yaml

from labkit.config.key_effects import REGISTRY
from labkit.config.unread_keys import entries as unread_entries

HEAD = """# Every verl key, by its memory effect

`labkit memory` reads a config's keys into one memory answer. Every key a config sets is either priced (the memory
model reads it) or named in the answer, before the verdict and in `--json`'s `not_priced`, as one of: *not priced*
(it can move GPU memory; labkit does not model how), *not read here* (a key labkit prices that this run does not use:
a critic's key without a critic), *no effect in verl* (verl reads it and ignores it) or *not a verl key* (a fork's,
a recipe's or a typo: ignored for memory, never refused); a launch script's own entry point or a recipe's base YAML is
*read past* (its arguments priced as main_ppo's). Keys with no GPU-memory effect are not listed in answers.

This page is generated from `data/key_effects.yaml` (`labkit.memory.key_effects_doc.render`). A key is decided by the
first entry whose pattern matches it (`*` crosses dots); a test walks every key of the installed verl releases'
YAMLs (0.9.1, 0.8.0, 0.7.1, and 0.1-0.4 as their YAMLs had them) and fails on any key no entry matches.
[memory.md](memory.md) names the term each priced key moves.
"""

SECTIONS = (
    ("priced", False, "Priced", "The memory model reads these keys."),
    ("none", True, "Read by verl and ignored", "Set, they change nothing: the answer says so (`no effect in verl`)."),
    ("not_priced", False, "Not priced", "Each can move GPU memory; the answer names it with what it would change."),
    ("none", False, "No GPU-memory effect", "Logging, paths, schedules, the loss's math: why each changes no memory."),
)

UNREAD_LEAD = """Audited in the code of verl 0.7.1 (legacy workers), 0.8.0 (engine workers, v0 loop), 0.9.0 and 0.9.1 (either loop), for
FSDP and Megatron: `scripts/verl_key_reads.py` scans the code each path runs for every key of its YAML, and a test
keeps this list equal to what the scan finds. A path is `<release> <loop> <engine>` (`*` for any). Set on such a
path, a key is named in the answer as *no effect in verl*, with the code that reads it elsewhere. *Passed* keys are
handed whole to another library, which reads them. Other releases are not audited: the answer does not say.
"""


def render() -> str:
    """The whole docs/memory_keys.md."""
    entries = yaml.safe_load(REGISTRY.read_text())
    out = [HEAD]
    for effect, silent, title, lead in SECTIONS:
        chosen = [e for e in entries if e["effect"] == effect and bool(e.get("silent")) == silent]
        keys = sum(len(e["keys"]) for e in chosen)
        out.append(f"\n## {title} ({keys} patterns)\n\n{lead}\n")
        if effect == "priced":
            out.append("\n" + "\n".join(f"- `{k}`" for e in chosen for k in e["keys"]) + "\n")
            continue
        out.append("\n| keys | " + ("what it would change" if effect == "not_priced" else "why") + " |\n|---|---|\n")
        for e in chosen:
            text = (e.get("would") or e.get("why") or "").replace("|", "\\|").replace("\n", " ")
            out.append(f"| {'<br>'.join(f'`{k}`' for k in e['keys'])} | {text} |\n")
    out.append(
        f"\n## Keys verl never reads where they are set\n\n{UNREAD_LEAD}\n| keys | where | what happens |\n|---|---|---|\n"
    )
    for e in unread_entries():
        what = f"passed to `{e.to}`" if e.kind == "passed" else e.why.replace("|", "\\|")
        paths = ", ".join(f"`{at}`" for at in e.at)
        out.append(f"| {'<br>'.join(f'`{k}`' for k in e.keys)} | {paths}: `{e.where}` | {what} |\n")
    return "".join(out)
