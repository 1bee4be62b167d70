"""The v1 loop's sessions as the command line gives them: which failed (``--failed-sessions``: indices, or a rate
drawn with the seed) and the order the rest finished in (``--completion-order``: a list, ``submission``, or
``random:SEED``). Each spec is read once into trajectory indices p·n + session."""

from __future__ import annotations

import random

MAX_ITEMS = 1_000_000


def failed_from(spec: str | None, total: int, seed: int = 0) -> list[int]:
    """``"3,7,12"`` (trajectory indices) or ``"rate=0.1"`` (that share of the B·n = ``total`` sessions, drawn with
    ``seed``); None or "" -> none. ValueError with the reason otherwise."""
    text = (spec or "").strip()
    if not text:
        return []
    if text.startswith("rate="):
        try:
            rate = float(text[5:])
        except ValueError:
            raise ValueError(f"--failed-sessions {text[:60]!r}: rate=R takes a number from 0 to 1") from None
        if not 0 <= rate <= 1:
            raise ValueError(f"--failed-sessions {text[:60]!r}: rate=R takes a number from 0 to 1")
        return sorted(random.Random(seed).sample(range(total), round(rate * total)))
    return _indices(text, total, "--failed-sessions")


def order_from(spec: str | None, survivors: list[int]) -> list[int] | None:
    """``submission`` (or None) -> None (verl's order when sessions finish as submitted); ``random:SEED`` -> the
    survivors shuffled with SEED; ``"i,j,..."`` -> that order (each survivor once)."""
    text = (spec or "submission").strip()
    if text == "submission":
        return None
    if text.startswith("random:"):
        seed = text[7:]
        if not seed.isdigit() or len(seed) > 10:
            raise ValueError(f"--completion-order {text[:60]!r}: random:SEED takes a seed 0..2**32-1")
        order = list(survivors)
        random.Random(int(seed)).shuffle(order)
        return order
    order = _indices(text, max(survivors, default=-1) + 1, "--completion-order")
    if sorted(order) != sorted(survivors):
        raise ValueError(
            f"--completion-order lists {len(order)} indices; it must list each of the {len(survivors)} surviving "
            "trajectories (p·n + session, failed sessions left out) once"
        )
    return order


def _indices(text: str, total: int, option: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) > MAX_ITEMS or not all(p.isdigit() and len(p) <= 12 for p in parts):
        raise ValueError(f"{option} {text[:60]!r}: expected comma-separated trajectory indices 0..{total - 1}")
    out = [int(p) for p in parts]
    if any(i >= total for i in out) or len(set(out)) != len(out):
        raise ValueError(f"{option}: indices must be distinct and in 0..{total - 1} (p·n + session)")
    return out
