"""The tokens of a launch script as labkit's static bash reader sees them: a word's parts (literal characters, a
parameter, a command substitution, an arithmetic expansion), the token that holds them or an operator, and the
syntax error the reader stops on. Read by the lexer, the parser and the expander (the ``bash_`` modules of ``labkit.config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


class BashSyntaxError(ValueError):
    """Text the lexer cannot split (an unclosed quote, ``$(`` or ``${``); ``line`` is 1-based."""

    def __init__(self, line: int, what: str) -> None:
        super().__init__(f"line {line}: {what}")
        self.line, self.what = line, what


@dataclass(frozen=True)
class Lit:
    """Literal characters; ``quoted``: inside quotes or escaped (never split)."""

    text: str
    quoted: bool


@dataclass(frozen=True)
class Param:
    """``$NAME``, ``${NAME}``, ``${NAME[idx]}``, ``${NAME:-word}`` ... (``op`` "" for none, ``length`` for ``${#X}``,
    ``unsupported`` for an operator labkit does not evaluate, with the source text in ``raw``)."""

    name: str
    quoted: bool
    op: str = ""
    arg: tuple = ()
    index: str | None = None
    raw: str = ""


@dataclass(frozen=True)
class CmdSub:
    """``$(...)`` or a backtick command substitution: its text, never run."""

    text: str
    quoted: bool


@dataclass(frozen=True)
class Arith:
    """``$((...))``: the expression's text, expanded then evaluated as integer arithmetic."""

    text: str
    quoted: bool


@dataclass
class Token:
    """A word (``parts``), an operator (``op``) or a redirection (``op`` such as ``>`` or ``2>&1``); ``glued``: no
    blank before it (``A=(`` opens an array only when glued to its word)."""

    line: int
    parts: list = field(default_factory=list)
    op: str = ""
    glued: bool = False
    heredoc: str = ""

    @property
    def is_word(self) -> bool:
        return not self.op

    def literal(self) -> str | None:
        """The word's text when it is only literal characters (quoted or not), else None."""
        if not self.is_word or any(not isinstance(p, Lit) for p in self.parts):
            return None
        return "".join(p.text for p in self.parts)

    def lead(self) -> str:
        """The unquoted literal characters the word starts with (``NAME=`` of an assignment)."""
        out = []
        for p in self.parts:
            if not isinstance(p, Lit) or p.quoted:
                break
            out.append(p.text)
        return "".join(out)
