"""One claim of the two blog posts, the cases its check computes, and the verdict derived from them.

A check returns ``Case``s: what the claim states (``claimed``) next to what labkit computes (``observed``), per verl
version where the answer differs between versions. The verdict is never written by hand: ``verdict`` compares
claimed with observed, case by case (``Case.holds``), and reads the result through one rule (see ``verdict``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from labkit.rules.catalogue import entry

TRUE, CAVEAT, VERSION, FALSE, UNVERIFIABLE = "true", "true-with-caveat", "version-dependent", "false", "unverifiable"
VERDICTS = (TRUE, CAVEAT, VERSION, FALSE, UNVERIFIABLE)


@dataclass(frozen=True)
class Unknown:
    """An observation labkit cannot make (no input data, a statement about intent or wall-clock time): why not."""

    reason: str

    def __str__(self) -> str:
        return f"not computable: {self.reason}"


@dataclass
class Case:
    """One comparison: the claim's value next to labkit's, in one verl version (None: the same in all).

    ``caveat`` marks a condition the claim leaves out (it qualifies a true claim, it does not make it false).
    ``match`` compares claimed with observed (equality by default)."""

    what: str
    claimed: Any
    observed: Any
    version: str | None = None
    caveat: bool = False
    match: Callable[[Any, Any], bool] | None = None

    @property
    def holds(self) -> bool | None:
        """Whether labkit's value agrees with the claim's; None when labkit cannot compute it."""
        if isinstance(self.observed, Unknown):
            return None
        return bool(self.match(self.claimed, self.observed) if self.match else self.claimed == self.observed)

    def line(self, value: Any) -> str:
        where = f"[{self.version}] " if self.version else ""
        return f"{where}{self.what}: {value}"


def verdict(cases: Sequence[Case]) -> str:
    """The verdict of a claim from its cases.

    Core cases (not caveats) decide: one that labkit cannot compute makes the claim unverifiable; otherwise the
    claim holds in a version when every core case of that version (and every version-free one) holds. Holding in
    every version gives true (true-with-caveat when a caveat case fails), in none false, in some version-dependent.
    """
    core = [c for c in cases if not c.caveat]
    if not core:
        raise ValueError("a claim needs at least one core case")
    if any(c.holds is None for c in core):
        return UNVERIFIABLE
    versions = sorted({c.version for c in core if c.version is not None})
    holds_in = [all(c.holds for c in core if c.version in (None, v)) for v in versions or [None]]
    if all(holds_in):
        return CAVEAT if any(c.holds is False for c in cases if c.caveat) else TRUE
    return FALSE if not any(holds_in) else VERSION


@dataclass
class Result:
    """A claim checked: the cases, the derived verdict, and labkit's notes beside them."""

    claim: Claim
    cases: list[Case]
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return verdict(self.cases)

    @property
    def observed(self) -> str:
        """What labkit computed, one line per case."""
        return "\n".join(c.line(c.observed) for c in self.cases)

    @property
    def expected(self) -> str:
        """What the claim states, one line per case."""
        return "\n".join(c.line(c.claimed) for c in self.cases)

    @property
    def failing(self) -> list[Case]:
        """The cases where labkit's value contradicts the claim's."""
        return [c for c in self.cases if c.holds is False]

    @property
    def deciding(self) -> list[Case]:
        """The cases that keep the claim from being plainly true: contradicted or not computable."""
        return [c for c in self.cases if c.holds is not True]


Checked = list[Case] | tuple[list[Case], list[str]]
"""What a check returns: its cases, or its cases and notes (what labkit saw beside them)."""
Check = Callable[[], Checked]


@dataclass(frozen=True)
class Claim:
    """One claim: ``id`` (p1-07 = post 1, claim 7), the post, its group, the claim in a sentence, the verl versions
    (profile and loop, ``labkit.ui.seed_claims.probe.VERSIONS``) its check compares, the check, and the catalogue
    code whose entry says where verl implements it."""

    id: str
    post: int
    group: str
    text: str
    concerns: str
    check: Check
    code: str

    @property
    def where(self) -> str:
        """verl's file: function, from the catalogue."""
        return entry(self.code).where

    def run(self) -> Result:
        """Run the check: its cases and notes, with the verdict they imply."""
        out = self.check()
        cases, notes = out if isinstance(out, tuple) else (out, [])
        return Result(self, list(cases), list(notes))


CLAIMS: list[Claim] = []
"""Every claim, in the order the modules register them (``labkit.ui.seed_claims.all_claims`` sorts by id)."""


def claim(claim_id: str, group: str, code: str, concerns: str) -> Callable[[Check], Check]:
    """Decorator: register the check under ``claim_id`` (``p1-07`` = post 1, claim 7); its docstring is the claim."""

    def add(fn: Check) -> Check:
        if any(c.id == claim_id for c in CLAIMS):
            raise ValueError(f"claim {claim_id} registered twice")
        entry(code)  # KeyError now, not when the table is drawn
        text = " ".join((fn.__doc__ or "").split())
        CLAIMS.append(Claim(claim_id, int(claim_id[1]), group, text, concerns, fn, code))
        return fn

    return add
