"""Bash's words for a launch script, read statically: a word's quoting and expansions
(``$VAR``, ``${VAR...}``, ``$(...)``, backticks, ``$((...))``), split as bash splits them and never expanded here
(``labkit.config.bash_expand`` does that), into the tokens of ``labkit.config.bash_tokens``;
``labkit.config.bash_tokenize`` reads the operators between words.
"""

from __future__ import annotations

import re

from labkit.config.bash_tokens import Arith, BashSyntaxError, CmdSub, Lit, Param

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL = "@*#?$!-0123456789"
_PARAM_OPS = (":-", ":=", ":+", ":?", "-", "=", "+", "?")


class WordLexer:
    """A cursor over the text that reads one word (or the inside of double quotes) at a time."""

    def __init__(self, text: str) -> None:
        self.s, self.i, self.line = text, 0, 1

    def error(self, what: str) -> BashSyntaxError:
        return BashSyntaxError(self.line, what)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def word(self, stop: str = "", quoted: bool = False) -> list:
        """Parts of one word, up to a blank or an operator (or ``stop`` inside ``${...}``)."""
        parts: list = []
        buf: list[str] = []

        def flush(q: bool = False) -> None:
            if buf:
                parts.append(Lit("".join(buf), q or quoted))
                buf.clear()

        while self.i < len(self.s):
            c = self.s[self.i]
            if stop:
                if c == stop:
                    break
            elif c in " \t\r\n;&|()<>":
                break
            if c == "\\":
                nxt = self.peek(1)
                if nxt == "\n":
                    self.i += 2
                    self.line += 1
                    continue
                flush()
                if nxt:
                    parts.append(Lit(nxt, True))
                self.i += 2
                continue
            if c == "'":
                flush()
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise self.error("a single quote is never closed")
                text = self.s[self.i + 1 : end]
                self.line += text.count("\n")
                parts.append(Lit(text, True))
                self.i = end + 1
                continue
            if c == '"':
                flush()
                self.i += 1
                parts.extend(self.dquoted())
                continue
            if c == "$" or c == "`":
                part = self.dollar(quoted)
                if part is not None:
                    flush()
                    parts.append(part)
                    continue
            buf.append(c)
            if c == "\n":
                self.line += 1
            self.i += 1
        flush()
        return parts

    def dquoted(self) -> list:
        """The parts of a double-quoted string (the opening quote read); backslash escapes only $ ` " \\ newline."""
        parts: list = []
        buf: list[str] = []
        start = self.line
        while True:
            if self.i >= len(self.s):
                raise BashSyntaxError(start, "a double quote is never closed")
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                break
            if c == "\\" and self.peek(1) in ("$", "`", '"', "\\", "\n"):
                if self.peek(1) == "\n":
                    self.line += 1
                else:
                    buf.append(self.peek(1))
                self.i += 2
                continue
            if c in "$`":
                part = self.dollar(True)
                if part is not None:
                    if buf:
                        parts.append(Lit("".join(buf), True))
                        buf = []
                    parts.append(part)
                    continue
            if c == "\n":
                self.line += 1
            buf.append(c)
            self.i += 1
        if buf or not parts:
            parts.append(Lit("".join(buf), True))  # "" is an empty word, not none
        return parts

    def _balanced(self, open_: str, close: str, start: int) -> int:
        """Index just past the ``close`` that matches an ``open_`` before ``start``, skipping quotes."""
        depth, j, s = 1, start, self.s
        while j < len(s):
            c = s[j]
            if c == "\\":
                j += 2
                continue
            if c == "'" and open_ != "{":
                k = s.find("'", j + 1)
                j = (k if k >= 0 else len(s)) + 1
                continue
            if c == '"':
                k = j + 1
                while k < len(s) and s[k] != '"':
                    k += 2 if s[k] == "\\" else 1
                j = k + 1
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        raise self.error(f"'{open_}' is never closed by '{close}'")

    def dollar(self, quoted: bool):
        """A ``$`` expansion or a backtick substitution at the cursor, or None for a literal ``$``."""
        s, i = self.s, self.i
        if s[i] == "`":
            end = s.find("`", i + 1)
            if end < 0:
                raise self.error("a backtick is never closed")
            self.line += s.count("\n", i, end)
            self.i = end + 1
            return CmdSub(s[i + 1 : end], quoted)
        nxt = self.peek(1)
        if nxt == "(" and self.peek(2) == "(":
            end = self._balanced("(", ")", i + 3)
            if end >= len(s) or s[end] != ")":
                raise self.error("$(( is not closed by '))'")
            text = s[i + 3 : end - 1]
            self.line += text.count("\n")
            self.i = end + 1
            return Arith(text, quoted)
        if nxt == "(":
            end = self._balanced("(", ")", i + 2)
            text = s[i + 2 : end - 1]
            self.line += text.count("\n")
            self.i = end
            return CmdSub(text, quoted)
        if nxt == "{":
            return self.braced(quoted)
        m = _NAME.match(s, i + 1)
        if m:
            self.i = m.end()
            return Param(m.group(0), quoted, raw=m.group(0))
        if nxt and nxt in _SPECIAL:
            self.i = i + 2
            return Param(nxt, quoted, raw=nxt)
        if nxt == "'" and not quoted:
            raise self.error("$'...' (ANSI-C quoting)")
        return None

    def braced(self, quoted: bool) -> Param:
        """``${...}`` at the cursor."""
        start = self.i
        end = self._balanced("{", "}", self.i + 2)
        raw = self.s[start:end]
        self.i = start + 2
        length = False
        if self.peek() == "#" and self.peek(1) not in ("}", ""):
            length, self.i = True, self.i + 1
        m = _NAME.match(self.s, self.i)
        if m:
            name, self.i = m.group(0), m.end()
        elif self.peek() and self.peek() in _SPECIAL:
            name, self.i = self.peek(), self.i + 1
        else:
            self.i = end
            return Param("", quoted, op="unsupported", raw=raw)
        index = None
        if self.peek() == "[":
            close = self.s.find("]", self.i)
            if close < 0 or close > end:
                raise self.error(f"{raw}: '[' is never closed")
            index, self.i = self.s[self.i + 1 : close], close + 1
        if self.peek() == "}":
            self.i = end
            return Param(name, quoted, op="length" if length else "", index=index, raw=raw)
        op = next((o for o in _PARAM_OPS if self.s.startswith(o, self.i)), None)
        if op is None and self.peek() == ":" and not length:  # ${X:offset[:length]}
            spec = self.s[self.i + 1 : end - 1]
            self.i = end
            return Param(name, quoted, op="substr", arg=tuple(spec.split(":", 1)), index=index, raw=raw)
        if op is None or length:
            self.line += raw.count("\n")
            self.i = end
            return Param(name, quoted, op="unsupported", index=index, raw=raw)
        self.i += len(op)
        line = self.line
        arg = self.word(stop="}", quoted=quoted)
        if self.i != end - 1:
            self.line = line + raw.count("\n")
        self.i = end
        return Param(name, quoted, op=op, arg=tuple(arg), index=index, raw=raw)


def lex_quoted(text: str, line: int = 1) -> list:
    """The parts of ``text`` read as the inside of double quotes (an arithmetic expression before evaluation)."""
    lx = WordLexer(text + '"')
    lx.line = line
    return lx.dquoted()
