"""Bash's compound commands for a launch script: ``if``/``elif``/``else``, ``case``, ``for``, ``[[ ... ]]``, the
``(( ... ))`` and group nodes, and the constructs skipped as ``Unsupported``, over the token cursor the whole parser
of ``labkit.config.bash_parse`` walks with (its statement lists parse the bodies).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from labkit.config.bash_tokens import BashSyntaxError, Token


@dataclass
class If:
    line: int
    clauses: list[tuple[list, list]]  # (condition statements, body statements)
    orelse: list | None = None


@dataclass
class Case:
    line: int
    word: Token
    items: list[tuple[list[Token], list]]


@dataclass
class For:
    line: int
    var: str
    words: list[Token] | None
    body: list


@dataclass
class Group:
    line: int
    body: list
    subshell: bool = False


@dataclass
class Cond:
    """``[[ ... ]]``: its tokens (words and operators) between the brackets."""

    line: int
    tokens: list[Token]


@dataclass
class ArithCmd:
    line: int
    token: Token


@dataclass
class Unsupported:
    line: int
    what: str


class TokenCursor:
    """The position in the token list and the reads every rule of the parser shares."""

    def __init__(self, tokens: list[Token]) -> None:
        self.t, self.i = tokens, 0

    def peek(self) -> Token:
        return self.t[min(self.i, len(self.t) - 1)]

    def next(self) -> Token:
        tok = self.peek()
        self.i += 1
        return tok

    def at_end(self) -> bool:
        return self.i >= len(self.t)

    def keyword(self, tok: Token | None = None) -> str | None:
        tok = tok or self.peek()
        lit = tok.literal() if tok.is_word and all(not p.quoted for p in tok.parts) else None
        return lit

    def error(self, what: str) -> BashSyntaxError:
        return BashSyntaxError(self.peek().line, what)

    def skip_newlines(self) -> None:
        while not self.at_end() and self.peek().op in ("\n", ";"):
            self.i += 1

    def expect(self, word: str) -> None:
        self.skip_newlines()
        if self.keyword() != word:
            raise self.error(f"expected '{word}'")
        self.i += 1


class CompoundParser(TokenCursor):
    """The compound commands; ``statements`` is the parser's statement list (``labkit.config.bash_parse``)."""

    statements: Callable[..., list]

    def skip_unsupported(self, tok: Token, what: str) -> Unsupported:
        """Skip a construct labkit does not evaluate, to its matching end, so the rest still parses."""
        depth, seen = 0, False
        openers, closers = {"do", "{", "if", "case"}, {"done", "}", "fi", "esac"}
        while not self.at_end():
            kw = self.keyword()
            if kw in openers:
                depth, seen = depth + 1, True
            elif kw in closers:
                depth -= 1
            self.i += 1
            if seen and depth <= 0:
                break
        return Unsupported(tok.line, what)

    def if_(self) -> If:
        line = self.next().line
        clauses, orelse = [], None
        cond = self.statements(until=("then",))
        self.expect("then")
        body = self.statements(until=("elif", "else", "fi"))
        clauses.append((cond, body))
        while True:
            kw = self.keyword()
            self.i += 1
            if kw == "elif":
                cond = self.statements(until=("then",))
                self.expect("then")
                clauses.append((cond, self.statements(until=("elif", "else", "fi"))))
            elif kw == "else":
                orelse = self.statements(until=("fi",))
            elif kw == "fi":
                return If(line, clauses, orelse)
            else:
                raise BashSyntaxError(line, "an 'if' is never closed by 'fi'")

    def case(self) -> Case:
        line = self.next().line
        word = self.next()
        self.expect("in")
        items = []
        while True:
            self.skip_newlines()
            if self.keyword() == "esac":
                self.i += 1
                return Case(line, word, items)
            if self.peek().op == "(":
                self.i += 1
            pats = []
            while True:
                tok = self.next()
                if not tok.is_word:
                    raise BashSyntaxError(tok.line, "a case pattern is not a word")
                pats.append(tok)
                sep = self.next()
                if sep.op == ")":
                    break
                if sep.op != "|":
                    raise BashSyntaxError(sep.line, "a case pattern is not closed by ')'")
            body = self.statements(until=("esac",))
            if self.peek().op == ";&":
                raise self.error("';&' (a case fall-through)")
            if self.peek().op == ";;":
                self.i += 1
            items.append((pats, body))

    def for_(self):
        tok = self.next()
        var = self.next()
        if var.op == "((":
            return self.skip_unsupported(tok, "an arithmetic for loop")
        name = var.literal()
        words = None
        while not self.at_end() and self.peek().op == "\n":
            self.i += 1
        if self.keyword() == "in":
            self.i += 1
            words = []
            while self.peek().is_word:
                words.append(self.next())
        self.expect("do")
        body = self.statements(until=("done",))
        self.i += 1
        return For(tok.line, name or "", words, body)

    def cond(self) -> Cond:
        line = self.next().line
        toks = []
        while self.keyword() != "]]":
            if self.at_end() or self.peek().op == "\n":
                raise BashSyntaxError(line, "'[[' is never closed by ']]'")
            toks.append(self.next())
        self.i += 1
        return Cond(line, toks)
