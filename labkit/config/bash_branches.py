"""Bash's branches, statically: a condition labkit cannot decide runs every branch on a copy of the shell and keeps
what the branches that survive agree on (a branch that exits never reaches the launch); a value they disagree on
becomes unknown, with the reason. Also the launch a branch may reach (``Launch``), which ends the walk of
``labkit.config.bash_reader``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from labkit.config.bash_builtins import ScriptExit
from labkit.config.bash_expand import MARK, Refusal, Shell, Val, unknown_val


@dataclass
class Launch:
    """The first command that launches verl: its line, every field (program first), the ``VAR=value`` prefix."""

    line: int
    argv: list[Val]
    env: dict[str, Val] = field(default_factory=dict)


class _Launched(Exception):
    def __init__(self, launch: Launch) -> None:
        self.launch = launch


class Branches:
    """``explore`` over ``self.sh`` (the reader's shell)."""

    sh: Shell

    def explore(self, branches: list[Callable[[], int | None]], line: int, why: str) -> int | None:
        """Run each branch on a copy of the shell; keep the variables every surviving branch agrees on."""
        base, survivors = self.sh, []
        for fn in branches:
            self.sh = base.copy()
            try:
                survivors.append((self.sh, fn()))
            except ScriptExit:
                continue
            except _Launched as got:
                self.sh = base
                raise Refusal(got.launch.line, f"the launch depends on line {line}: {why}") from None
        if not survivors:
            self.sh = base
            raise ScriptExit(line)
        self.sh = _merge([s for s, _ in survivors], f"line {line}: {why}")
        statuses = {st for _, st in survivors}
        return statuses.pop() if len(statuses) == 1 else None


def _merge(shells: list[Shell], why: str) -> Shell:
    """One shell from the branches' shells: values they agree on stay; others become unknown, with ``why``."""
    out = shells[0].copy()
    if len(shells) == 1:
        return out
    for name in {n for s in shells for n in s.scalars} | {n for s in shells for n in s.arrays}:
        values = [s.arrays[name] if name in s.arrays else s.scalars.get(name) for s in shells]
        if all(v == values[0] for v in values[1:]):
            continue
        reason = f"${name} depends on {why}"
        if all(isinstance(v, list) and len(v) == len(values[0]) for v in values):  # arrays: element by element
            out.scalars.pop(name, None)
            out.arrays[name] = [_common([v[k] for v in values], reason) for k in range(len(values[0]))]
            continue
        out.arrays.pop(name, None)
        known = [v for v in values if isinstance(v, Val)]
        out.scalars[name] = _common(known, reason) if len(known) == len(values) else unknown_val(reason)
    for s in shells[1:]:
        for k, v in s.assumed.items():
            out.assumed.setdefault(k, v)
        out.nounset = out.nounset or s.nounset
    if any(s.out != out.out for s in shells):
        out.out = [unknown_val(f"what is printed depends on {why}")]
    if any(s.positional != out.positional for s in shells):
        raise Refusal(0, f"the positional parameters depend on {why}")
    return out


def _common(vals: list[Val], why: str) -> Val:
    """One value for values that differ: the text they all start with, then an unknown part (so the key of
    ``key=value`` stays known when only the value differs)."""
    if all(v == vals[0] for v in vals[1:]):
        return vals[0]
    first = vals[0].text
    n = 0
    while n < len(first) and all(n < len(v.text) and v.text[n] == first[n] for v in vals[1:]):
        n += 1
    prefix = first[:n].split(MARK, 1)[0]
    return Val(prefix + MARK, unknown=next((v.unknown for v in vals if v.unknown), why))
