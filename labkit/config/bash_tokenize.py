"""Bash's tokens for a launch script, read statically: the words of ``labkit.config.bash_lex`` between blanks,
comments, line continuations, operators, redirections, ``((...))`` and here-documents.

One pass over the text, linear in its length; a construct the lexer cannot split raises ``BashSyntaxError``.
"""

from __future__ import annotations

import re

from labkit.config.bash_lex import WordLexer
from labkit.config.bash_tokens import Arith, BashSyntaxError, Lit, Token

OPERATORS = ("&&", "||", ";;", ";&", "|&", ";", "|", "&", "(", ")", "\n")
_REDIR = re.compile(r"(\d*|&)(>>|>&|<&|<<<|<<-|<<|<>|>\||>|<)")


class _Lexer(WordLexer):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.pending_heredocs: list[tuple[Token, str, bool]] = []

    def tokens(self) -> list[Token]:
        out: list[Token] = []
        glued = False
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
                continue
            if c in " \t\r":
                self.i += 1
                glued = False
                continue
            if c == "#" and not glued:
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
                continue
            if c == "\n":
                out.append(Token(self.line, op="\n"))
                self.i += 1
                self.line += 1
                self._read_heredocs()
                glued = False
                continue
            m = _REDIR.match(self.s, self.i)
            if m and (m.group(1) == "" or not glued):
                tok = Token(self.line, op=m.group(0), glued=glued)
                self.i = m.end()
                out.append(tok)
                if m.group(2) in ("<<", "<<-"):
                    self._heredoc_word(tok, strip=m.group(2) == "<<-")
                glued = False
                continue
            if c == "(" and self.peek(1) == "(" and not glued:  # ((expr)): an arithmetic command
                end = self._balanced("(", ")", self.i + 2)
                if end >= len(self.s) or self.s[end] != ")":
                    raise self.error("(( is not closed by '))'")
                out.append(Token(self.line, parts=[Arith(self.s[self.i + 2 : end - 1], False)], op="(("))
                self.line += self.s.count("\n", self.i, end)
                self.i = end + 1
                continue
            op = next((o for o in OPERATORS if self.s.startswith(o, self.i)), None)
            if op is not None:
                out.append(Token(self.line, op=op, glued=glued))
                self.i += len(op)
                glued = False
                continue
            line = self.line
            out.append(Token(line, parts=self.word(), glued=glued))
            glued = True
        out.append(Token(self.line, op="\n"))
        return out

    def _heredoc_word(self, tok: Token, strip: bool) -> None:
        while self.peek() in (" ", "\t"):
            self.i += 1
        start = self.i
        word = Token(self.line, parts=self.word())
        if self.i == start:
            raise self.error("a here-document without a delimiter word")
        delim = "".join(p.text if isinstance(p, Lit) else "" for p in word.parts)
        self.pending_heredocs.append((tok, delim, strip))

    def _read_heredocs(self) -> None:
        for tok, delim, strip in self.pending_heredocs:
            body = []
            while True:
                if self.i >= len(self.s):
                    raise BashSyntaxError(tok.line, f"here-document '<<{delim}' is never closed")
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                text = self.s[self.i : end]
                self.i = min(end + 1, len(self.s))
                self.line += 1
                if (text.lstrip("\t") if strip else text) == delim:
                    break
                body.append(text)
            tok.heredoc = "\n".join(body)
        self.pending_heredocs = []


def tokenize(text: str) -> list[Token]:
    """The tokens of a script (a final newline token always ends the list); BashSyntaxError if it cannot split."""
    return _Lexer(text).tokens()
