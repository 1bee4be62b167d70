"""Bash's integer arithmetic (``$((...))``, ``((...))``), statically: 64-bit, C division, a bare name read as its
value's expression; an unknown value raises ``UnknownValue``, anything else bash would reject a ``Refusal``."""

from __future__ import annotations

import re

from labkit.config.bash_values import Refusal, Shell, UnknownValue, short

_ATOM = re.compile(
    r"\s*(0[xX][0-9a-fA-F]+|\d+|[A-Za-z_][A-Za-z0-9_]*|\*\*|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%()<>!~?:^&|])"
)
_BIN = {
    "||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, ">": 7, "<=": 7, ">=": 7,
    "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10, "**": 11,
}  # fmt: skip


class ArithEval:
    """A precedence-climbing evaluator of bash's integer expressions (64-bit, C division)."""

    def __init__(self, text: str, shell: Shell, line: int, depth: int = 0) -> None:
        self.toks, self.k, self.sh, self.line, self.depth = [], 0, shell, line, depth
        pos, text = 0, text.strip()
        while pos < len(text):
            m = _ATOM.match(text, pos)
            if not m:
                raise Refusal(line, f"$(({short(text)})): cannot read {text[pos:].strip()[:20]!r}")
            self.toks.append(m.group(1))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.text = text

    def fail(self, what: str) -> Refusal:
        return Refusal(self.line, f"$(({short(self.text)})): {what}")

    def run(self) -> int:
        if not self.toks:
            return 0
        v = self.expr(0)
        if self.k != len(self.toks):
            raise self.fail(f"unexpected {self.toks[self.k]!r}")
        return v

    def peek(self) -> str:
        return self.toks[self.k] if self.k < len(self.toks) else ""

    def expr(self, min_prec: int) -> int:
        left = self.unary()
        while True:
            op = self.peek()
            if op == "?" and min_prec == 0:
                self.k += 1
                a = self.expr(0)
                if self.peek() != ":":
                    raise self.fail("'?' without ':'")
                self.k += 1
                b = self.expr(0)
                left = a if left else b
                continue
            prec = _BIN.get(op)
            if prec is None or prec < min_prec:
                return left
            self.k += 1
            right = self.expr(prec if op == "**" else prec + 1)
            left = self.binary(op, left, right)

    def binary(self, op: str, a: int, b: int) -> int:
        if op in ("/", "%"):
            if b == 0:
                raise self.fail("division by 0")
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
            return q if op == "/" else a - q * b
        if op == "**":
            if b < 0:
                raise self.fail("exponent less than 0")
            if b > 64 and abs(a) > 1:
                raise self.fail("exponent too large")
        ops = {
            "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "**": lambda: a**b,
            "<<": lambda: a << (b & 63), ">>": lambda: a >> (b & 63), "&": lambda: a & b, "|": lambda: a | b,
            "^": lambda: a ^ b, "==": lambda: int(a == b), "!=": lambda: int(a != b), "<": lambda: int(a < b),
            ">": lambda: int(a > b), "<=": lambda: int(a <= b), ">=": lambda: int(a >= b),
            "&&": lambda: int(bool(a and b)), "||": lambda: int(bool(a or b)),
        }  # fmt: skip
        return _wrap(ops[op]())

    def unary(self) -> int:
        tok = self.peek()
        self.k += 1
        if tok in ("-", "+", "!", "~"):
            v = self.unary()
            return {"-": -v, "+": v, "!": int(not v), "~": ~v}[tok]
        if tok == "(":
            v = self.expr(0)
            if self.peek() != ")":
                raise self.fail("'(' is never closed")
            self.k += 1
            return v
        if tok[:1].isdigit():
            try:
                return _wrap(int(tok, 16) if tok[:2].lower() == "0x" else int(tok, 8) if tok[0] == "0" else int(tok))
            except ValueError:
                raise self.fail(f"{tok}: value too great for base") from None
        if tok[:1].isalpha() or tok[:1] == "_":
            return self.variable(tok)
        raise self.fail(f"unexpected {tok!r}" if tok else "the expression ends early")

    def variable(self, name: str) -> int:
        """A bare name is its value read as an expression (unset or empty: 0), as bash does."""
        got = self.sh.get(name)
        if got is None:
            got = self.sh.unset_value(name, self.line, has_default=False)
        if got.unknown:
            raise UnknownValue(got)
        if not got.text.strip():
            return 0
        if self.depth > 16:
            raise self.fail(f"{name} refers to itself")
        return ArithEval(got.text, self.sh, self.line, self.depth + 1).run()


def _wrap(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v
