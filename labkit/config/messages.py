"""Error messages that quote the user's input: one line, and at most ~200 characters of any one quoted piece (a
100 KB key or a 15 KB ``--lengths`` is shown by its start and its length)."""

from __future__ import annotations

import re

PIECE = 120
"""A run of non-blank characters longer than this is cut."""
TOTAL = 600
"""A whole message longer than this is cut."""


def clip(message: str) -> str:
    """``message`` on one line, each long run of non-blank characters cut to its first 100 and its length."""
    one = " ".join(str(message).split("\n"))
    one = re.sub(rf"\S{{{PIECE + 1},}}", lambda m: f"{m.group(0)[:100]}…({len(m.group(0)):,} characters)", one)
    return one if len(one) <= TOTAL else one[: TOTAL - 1] + "…"


class InputError(ValueError):
    """Base of labkit's input errors: the message is clipped once, here, for every command."""

    def __init__(self, message: object = "") -> None:
        super().__init__(clip(str(message)))


class ConfigError(InputError):
    """A config labkit cannot read: unknown key, wrong type, out-of-range size, malformed YAML."""
