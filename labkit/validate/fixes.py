"""Smallest config changes that make a failing (or silently ragged) config pass every verl check.

Each candidate of ``fix_candidates`` is re-checked on the whole config, and a candidate that clears its finding but
leaves another error is extended with the part of a greedy repair plan it needs (``Searcher``).
"""

from __future__ import annotations

from collections.abc import Callable

from labkit.config.messages import ConfigError
from labkit.config.verl_config import VerlConfig
from labkit.validate.fix_candidates import DEL, Change, candidates
from labkit.validate.snapshot import ERROR, Finding, Snap


def fmt(change: Change) -> str:
    """Hydra-style override text: 'a=1 b=true ~c' (several overrides are separated by spaces)."""
    parts = []
    for path, v in change.items():
        if v == DEL:
            parts.append(f"~{path}")
        else:
            text = "null" if v is None else ("true" if v is True else "false" if v is False else str(v))
            parts.append(f"{path}={text}")
    return " ".join(parts)


Evaluate = Callable[[VerlConfig], "tuple[Snap, list[Finding]]"]
FIXED = {"S1": "S1", "S2": "S1", "E31": "E31", "N2": "N2"}  # non-errors that get fixes (S2 shares S1's)


class Searcher:
    """Verified fixes for every finding of one config, within a budget of re-checks.

    A greedy repair plan (first error -> its first candidate that clears it -> next error ...) supplies the
    changes a finding's own candidate needs so that the WHOLE config passes; the merged change is then
    minimised (plan parts that are not needed are dropped).
    """

    def __init__(self, cfg: VerlConfig, s: Snap, checks: list[Finding], evaluate: Evaluate, budget: int) -> None:
        self.cfg, self.s, self.checks, self.evaluate, self.budget = cfg, s, checks, evaluate, budget
        self.plan: list[Change] | None = None

    def _eval(self, change: Change) -> list[Finding] | None:
        c = _apply(self.cfg, change)
        if c is None or self.budget <= 0:
            return None
        self.budget -= 1
        return self.evaluate(c)[1]

    def _passes(self, change: Change, f: Finding) -> bool:
        """The change clears f (same code and role) and leaves no error anywhere."""
        checks = self._eval(change)
        return checks is not None and not any(
            x.severity == ERROR or x.severity != "pass" and x.code == f.code and x._role == f._role for x in checks
        )

    def _repair_plan(self) -> list[Change]:
        """Greedy: repeatedly fix the first error with the first candidate that clears it without adding errors."""
        plan: list[Change] = []
        cfg, s, checks = self.cfg, self.s, self.checks
        for _ in range(8):
            errors = [x for x in checks if x.severity == ERROR]
            if not errors:
                break
            f = errors[0]
            for change in candidates(f, s)[:6]:
                c = _apply(cfg, change)
                if c is None or self.budget <= 0:
                    continue
                self.budget -= 1
                s2, checks2 = self.evaluate(c)
                errors2 = [x for x in checks2 if x.severity == ERROR]
                if len(errors2) <= len(errors) and not any(x.code == f.code and x._role == f._role for x in errors2):
                    plan.append(change)
                    cfg, s, checks = c, s2, checks2
                    break
            else:
                break
        return plan

    def fixes_for(self, f: Finding) -> list[str]:
        """Up to three fixes for f, fewest overrides first; supersets of a smaller fix are dropped."""
        if self.plan is None:
            self.plan = self._repair_plan()
        found: list[tuple[int, int, Change]] = []
        for i, change in enumerate(candidates(f, self.s)):
            if self.budget <= 0 or sum(len(c) == 1 for _, _, c in found) >= 3:
                break
            result = self._complete(change, f)
            if result is not None:
                found.append((len(result), i, result))
        if not found and self.plan and self.budget > 0:  # no own candidate works: the (minimised) repair plan
            result = self._complete({}, f)
            if result:
                found.append((len(result), 0, result))
        kept: list[Change] = []
        for _, _, change in sorted(found, key=lambda t: t[:2]):
            items = set(map(str, change.items()))
            if not any(set(map(str, k.items())) <= items for k in kept):
                kept.append(change)
        return [fmt(c) for c in kept[:3]]

    def _complete(self, change: Change, f: Finding) -> Change | None:
        """change alone if it passes, else change plus the minimal part of the repair plan that makes it pass."""
        if change and self._passes(change, f):
            return change
        extra = [p for p in self.plan if not set(p) & set(change)]
        if not extra:
            return None
        merged = _merge([change] + extra)
        if not self._passes(merged, f):
            return None
        for part in list(extra):  # minimise: drop plan parts this fix does not need
            trial = [p for p in extra if p is not part]
            if self._passes(_merge([change] + trial), f):
                extra = trial
        return _merge([change] + extra)


def _merge(parts: list[Change]) -> Change:
    out: Change = {}
    for p in parts:
        out.update(p)
    return out


def _apply(cfg: VerlConfig, change: Change) -> VerlConfig | None:
    """A copy of cfg with the change applied (None if a value is out of the key's range)."""
    c = cfg.copy()
    try:
        for path, v in change.items():
            if v == DEL:
                c.values.pop(path, None)
            else:
                c.set(path, v, origin="fix")
    except ConfigError:
        return None
    return c
