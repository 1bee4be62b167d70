"""The values of the static bash reader: a string bash would hold or an unknown one with the reason (``Val``),
the shell's variables (``Shell``), and a construct the reader refuses (``Refusal``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

IFS = " \t\n"
MAX_VALUE = 1 << 20  # characters in one expanded value (a doubling loop cannot exhaust memory)


@dataclass(frozen=True)
class Val:
    """A string bash would hold, or ``unknown`` (why labkit cannot know it: the line and the construct)."""

    text: str = ""
    unknown: str | None = None
    assumed: frozenset[str] = frozenset()

    def __add__(self, other: Val) -> Val:
        text = self.text + other.text
        if len(text) > MAX_VALUE:
            raise Refusal(0, f"a value grows past {MAX_VALUE:,} characters")
        return Val(text, self.unknown or other.unknown, self.assumed | other.assumed)


MARK = "\x00"  # stands for an unknown value inside a text (bash strings never hold a NUL)


def unknown_val(why: str) -> Val:
    """A value labkit does not know, with the reason (the line and the construct)."""
    return Val(MARK, unknown=why)


class Refusal(ValueError):
    """A construct the reader does not evaluate, reached on the way to the launch (``line`` 1-based)."""

    def __init__(self, line: int, what: str) -> None:
        super().__init__(f"line {line}: {what}" if line else what)
        self.line, self.what = line, what


@dataclass
class Shell:
    """Variables (scalars and indexed arrays), the positional parameters, ``set -u``, and the environment the
    caller vouches for (``env``: ``--set NAME=VALUE``; every other variable is absent from it)."""

    scalars: dict[str, Val] = field(default_factory=dict)
    arrays: dict[str, list[Val]] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_complete: bool = False  # True: a variable absent from env is unset (as in a test's scratch environment)
    nounset: bool = False
    assumed: dict[str, int] = field(default_factory=dict)  # variable read as unset -> first line
    subst: Callable[[str, int], Val | None] | None = None  # evaluates $(...) statically (bash_reader)
    out: list[Val] | None = None  # what echo/pwd print, inside a command substitution
    login: dict[str, str] = field(default_factory=dict)  # HOME, USER, PWD of the caller (every login shell has them)
    from_caller: dict[str, int] = field(default_factory=dict)  # login variables the script read -> first line

    def copy(self) -> Shell:
        return Shell(
            dict(self.scalars), {k: list(v) for k, v in self.arrays.items()}, list(self.positional), self.env,
            self.env_complete, self.nounset, dict(self.assumed), self.subst,
            list(self.out) if self.out is not None else None, self.login, dict(self.from_caller),
        )  # fmt: skip

    def is_set(self, name: str) -> bool:
        return name in self.scalars or name in self.arrays or name in self.env or name in self.login

    def get(self, name: str) -> Val | None:
        """The scalar value (an array's first element), the environment's, or None when unset."""
        if name in self.scalars:
            return self.scalars[name]
        if name in self.arrays:
            arr = self.arrays[name]
            return arr[0] if arr else None
        if name in self.env:
            return Val(self.env[name])
        if name in self.login:  # as bash takes it from the caller; the answer names it
            self.from_caller.setdefault(name, 0)
            return Val(self.login[name])
        return None

    def unset_value(self, name: str, line: int, has_default: bool) -> Val:
        """What an unset variable reads as: empty, with the assumption that the caller's environment lacks it
        (``${X:-default}``, or a scratch environment); unknown when the script needs the caller to set it."""
        if self.env_complete:
            if self.nounset and not has_default:
                raise Refusal(line, f"${name} is unset and the script runs under set -u (bash stops here)")
            return Val("")
        if has_default:
            self.assumed.setdefault(name, line)
            return Val("", assumed=frozenset([name]))
        return unknown_val(
            f"line {line}: ${name} is never set by the script (the caller's environment sets it); "
            f"pass --set {name}=VALUE"
        )


# -- words to fields ----------------------------------------------------------------------------------------------


class UnknownValue(Exception):
    """An arithmetic expression over a value labkit does not know."""

    def __init__(self, val: Val) -> None:
        super().__init__(val.unknown)
        self.val = val


def short(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= 60 else one[:57] + "..."
