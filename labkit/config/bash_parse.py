"""Bash's grammar for a launch script: the tokens of ``labkit.config.bash_tokenize`` as a tree of statements.

Simple commands with their assignments (``A=1``, ``A+=( ... )``) and redirections, ``&&``/``||`` lists and pipelines,
and the dispatch to the compound commands of ``labkit.config.bash_compound`` (``if``, ``case``, ``for``, ``{ ...; }``
and ``( ... )`` groups, ``[[ ... ]]``, ``(( ... ))``). Loops other than ``for`` and function definitions parse as
``Unsupported`` (refused if the reader reaches them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from labkit.config.bash_compound import ArithCmd, CompoundParser, Group
from labkit.config.bash_tokenize import tokenize
from labkit.config.bash_tokens import BashSyntaxError, Token

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=")
_RESERVED = {"then", "elif", "else", "fi", "do", "done", "esac", "}", "in"}
_UNSUPPORTED = {"while": "a while loop", "until": "an until loop", "select": "a select loop", "function": "a function"}


@dataclass
class Assign:
    """``NAME=word``, ``NAME+=word``, ``NAME[i]=word`` or ``NAME=( words )`` (``array`` not None)."""

    name: str
    append: bool
    value: Token | None
    array: list[Token] | None = None
    index: str | None = None


@dataclass
class Simple:
    """One simple command: assignments, words, redirections (operator, target word)."""

    line: int
    assigns: list[Assign] = field(default_factory=list)
    words: list[Token] = field(default_factory=list)
    redirs: list[tuple[str, Token | None]] = field(default_factory=list)


@dataclass
class Pipeline:
    line: int
    commands: list
    negate: bool = False


@dataclass
class AndOr:
    """``p1 && p2 || p3``: (connector, pipeline) pairs, the first connector empty."""

    line: int
    items: list[tuple[str, Pipeline]]


class _Parser(CompoundParser):
    # -- lists ----------------------------------------------------------------------------------------------------
    def statements(self, until: tuple[str, ...] = ()) -> list:
        out: list = []
        while True:
            self.skip_newlines()
            if self.at_end():
                if until:
                    raise self.error(f"the script ends before '{until[0]}'")
                return out
            tok = self.peek()
            if tok.op in (")", ";;", ";&") or (until and self.keyword() in until):
                return out
            if tok.op == "&":
                self.i += 1
                continue
            out.append(self.and_or())

    def and_or(self) -> AndOr:
        line = self.peek().line
        items = [("", self.pipeline())]
        while self.peek().op in ("&&", "||"):
            conn = self.next().op
            while not self.at_end() and self.peek().op == "\n":
                self.i += 1
            items.append((conn, self.pipeline()))
        return AndOr(line, items)

    def pipeline(self) -> Pipeline:
        line, negate = self.peek().line, False
        if self.keyword() == "!":
            self.i, negate = self.i + 1, True
        cmds = [self.command()]
        while self.peek().op in ("|", "|&"):
            self.i += 1
            while not self.at_end() and self.peek().op == "\n":
                self.i += 1
            cmds.append(self.command())
        return Pipeline(line, cmds, negate)

    # -- commands -------------------------------------------------------------------------------------------------
    def command(self):
        tok = self.peek()
        kw = self.keyword()
        if tok.op == "((":
            self.i += 1
            return ArithCmd(tok.line, tok)
        if tok.op == "(":
            self.i += 1
            body = self.statements()
            if self.next().op != ")":
                raise BashSyntaxError(tok.line, "'(' is never closed")
            return Group(tok.line, body, subshell=True)
        if kw == "{":
            self.i += 1
            body = self.statements(until=("}",))
            self.i += 1
            return Group(tok.line, body)
        if kw == "if":
            return self.if_()
        if kw == "case":
            return self.case()
        if kw == "for":
            return self.for_()
        if kw == "[[":
            return self.cond()
        if kw in _UNSUPPORTED:
            return self.skip_unsupported(tok, _UNSUPPORTED[kw])
        if tok.is_word and kw not in _RESERVED and self._is_function(tok):
            return self.skip_unsupported(tok, "a function definition")
        return self.simple()

    def _is_function(self, tok: Token) -> bool:
        if not re.fullmatch(r"[A-Za-z_][\w.:-]*", tok.literal() or ""):
            return False
        nxt = self.t[self.i + 1] if self.i + 1 < len(self.t) else None
        after = self.t[self.i + 2] if self.i + 2 < len(self.t) else None
        return bool(nxt and after and nxt.op == "(" and after.op == ")")

    def simple(self) -> Simple:
        cmd = Simple(self.peek().line)
        while not self.at_end():
            tok = self.peek()
            if tok.op and tok.op not in ("(",) and not _is_redir(tok.op):
                break
            if _is_redir(tok.op):
                self.i += 1
                target = self.next() if self.peek().is_word else None
                cmd.redirs.append((tok.op, target))
                continue
            if tok.op == "(":
                raise self.error("'(' in the middle of a command")
            m = _ASSIGN.match(tok.lead()) if not cmd.words else None
            if m:
                self.i += 1
                cmd.assigns.append(self.assignment(tok, m))
                continue
            if not cmd.words and self.keyword() in _RESERVED:
                break
            cmd.words.append(self.next())
        if not cmd.words and not cmd.assigns and not cmd.redirs:
            raise self.error(f"unexpected '{self.peek().op or self.keyword()}'".replace("\n", "newline"))
        return cmd

    def assignment(self, tok: Token, m: re.Match) -> Assign:
        name, index, append = m.group(1), m.group(2), bool(m.group(3))
        rest = _drop_lead(tok, len(m.group(0)))
        nxt = self.peek()
        if not rest.parts and nxt.op == "(" and nxt.glued:
            self.i += 1
            words = []
            while True:
                if self.at_end():
                    raise BashSyntaxError(tok.line, f"'{name}=(' is never closed by ')'")
                t = self.next()
                if t.op == ")":
                    break
                if t.op == "\n":
                    continue
                if not t.is_word or self.at_end():
                    raise BashSyntaxError(t.line, f"'{name}=(' holds an operator or is never closed")
                words.append(t)
            return Assign(name, append, None, array=words, index=index[1:-1] if index else None)
        return Assign(name, append, rest, index=index[1:-1] if index else None)


def _is_redir(op: str) -> bool:
    return bool(op) and op[-1] in "<>&|" and any(c in op for c in "<>")


def _drop_lead(tok: Token, n: int) -> Token:
    """The word without its first ``n`` unquoted literal characters (the ``NAME=`` of an assignment)."""
    parts = list(tok.parts)
    while n and parts:
        p = parts[0]
        if len(p.text) <= n:
            n -= len(p.text)
            parts.pop(0)
        else:
            parts[0] = type(p)(p.text[n:], p.quoted)
            n = 0
    return Token(tok.line, parts=parts)


def parse(text: str) -> list:
    """The statements of a script (BashSyntaxError naming the line of what it cannot parse)."""
    p = _Parser(tokenize(text))
    out = p.statements()
    if not p.at_end():
        tok = p.peek()
        raise BashSyntaxError(tok.line, f"unexpected '{tok.op or tok.literal()}'")
    return out
