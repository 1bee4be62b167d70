"""Bash's expansions, statically: a word of ``labkit.config.bash_lex`` becomes the fields bash would pass, over a
``Shell`` of known variables. A value labkit cannot know (a command substitution, a variable only the caller's
environment sets) is carried as ``Val.unknown`` with the reason, never guessed; a variable read as unset to take the
script's own default is recorded in ``Val.assumed``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from labkit.config.bash_lex import Arith, BashSyntaxError, CmdSub, Lit, Param, Token, lex_quoted

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

    def copy(self) -> Shell:
        return Shell(
            dict(self.scalars), {k: list(v) for k, v in self.arrays.items()}, list(self.positional), self.env,
            self.env_complete, self.nounset, dict(self.assumed), self.subst,
            list(self.out) if self.out is not None else None,
        )  # fmt: skip

    def is_set(self, name: str) -> bool:
        return name in self.scalars or name in self.arrays or name in self.env

    def get(self, name: str) -> Val | None:
        """The scalar value (an array's first element), the environment's, or None when unset."""
        if name in self.scalars:
            return self.scalars[name]
        if name in self.arrays:
            arr = self.arrays[name]
            return arr[0] if arr else None
        if name in self.env:
            return Val(self.env[name])
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
BREAK = object()  # a field boundary from "$@" or "${A[@]}"


class Expander:
    """Expansions of one word at ``line`` over ``shell``."""

    def __init__(self, shell: Shell, line: int) -> None:
        self.sh, self.line = shell, line

    def fields(self, tok: Token) -> list[Val]:
        """The fields of a command word: expansions, then word splitting of the unquoted ones (no globbing: a
        pattern is kept as written, as bash does when no file matches)."""
        return _split(self.segments(tok.parts))

    def value(self, parts) -> Val:
        """The word as one string (an assignment's right side: no splitting; ``"$@"`` joined by spaces)."""
        out = Val()
        for seg in self.segments(parts):
            if seg is not BREAK:
                out = out + seg[0]
            else:
                out = out + Val(" ")
        return out

    def segments(self, parts) -> list:
        segs: list = []
        for p in parts:
            if isinstance(p, Lit):
                segs.append((Val(p.text), p.quoted, True))
            elif isinstance(p, Param):
                try:
                    segs.extend(self.param(p))
                except _Unknown as exc:  # an index or offset over an unknown value
                    segs.append((unknown_val(str(exc.val.unknown)), p.quoted, False))
            elif isinstance(p, CmdSub):
                got = self.sh.subst(p.text, self.line) if self.sh.subst is not None else None
                if got is None or got.unknown:
                    got = unknown_val(f"line {self.line}: command substitution $({_short(p.text)}) is not run")
                segs.append((got, p.quoted, False))
            elif isinstance(p, Arith):
                try:
                    segs.append((Val(self.arith(p.text)), p.quoted, False))
                except _Unknown as exc:
                    segs.append((unknown_val(exc.val.unknown), p.quoted, False))
        return segs

    def param(self, p: Param) -> list:
        q = p.quoted
        if p.op == "unsupported":
            return [(unknown_val(f"line {self.line}: {p.raw} is not evaluated"), q, False)]
        if p.op == "substr":
            return self._substr(p)
        if p.name in ("@", "*") or p.index in ("@", "*"):
            return self._many(p)
        if p.name == "#":
            return [(Val(str(len(self.sh.positional))), q, False)]
        if p.name.isdigit() and p.name != "0":
            n = int(p.name)
            got = Val(self.sh.positional[n - 1]) if n <= len(self.sh.positional) else None
        elif p.name in ("0", "?", "$", "!", "-") or p.name == "BASH_SOURCE":
            why = f"line {self.line}: {p.raw} (the shell's own state) is not known"
            return [(unknown_val(why), q, False)]
        elif p.index is not None:
            got = self._element(p)
        else:
            got = self.sh.get(p.name)
        return [(v, q, False) for v in [self._apply(p, got)]]

    def _element(self, p: Param) -> Val | None:
        if p.name not in self.sh.arrays:
            return self.sh.get(p.name) if p.index.strip() == "0" else None
        i = int(self.arith(p.index))
        arr = self.sh.arrays[p.name]
        return arr[i] if -len(arr) <= i < len(arr) else None

    def _apply(self, p: Param, got: Val | None) -> Val:
        op, colon = p.op.lstrip(":"), p.op.startswith(":")
        if op == "length":
            return Val(str(len(got.text)), got.unknown, got.assumed) if got else self._unset(p, False)
        empty = got is None or (colon and got.text == "" and not got.unknown)
        if got is not None and got.unknown and colon and op in "-=+?":
            return unknown_val(got.unknown)  # labkit cannot tell whether the unknown value is empty
        if op == "":
            return got if got is not None else self._unset(p, False)
        if op in ("-", "="):
            if not empty:
                return got
            assumed = self._unset(p, True) if got is None else Val()
            default = self.value(p.arg)
            if op == "=":
                self.sh.scalars[p.name] = default
            return assumed + default
        if op == "+":
            return self.value(p.arg) if not empty else (self._unset(p, True) if got is None else Val())
        if op == "?":
            if not empty:
                return got
            if got is None and not self.sh.env_complete or got is not None and got.assumed:
                return unknown_val(f"line {self.line}: {p.raw} needs {p.name} from the caller's environment")
            raise Refusal(self.line, f"{p.raw}: {p.name} is {'empty' if got else 'unset'}, so bash stops here")
        raise Refusal(self.line, f"{p.raw} is not evaluated")

    def _unset(self, p: Param, has_default: bool) -> Val:
        return self.sh.unset_value(p.name, self.line, has_default)

    def _substr(self, p: Param) -> list:
        """``${X:off:len}`` (characters), ``${@:off:len}`` / ``${A[@]:off:len}`` (elements; ``$@`` counts from $0)."""
        off = int(self.arith(p.arg[0])) if p.arg[0].strip() else 0
        n = int(self.arith(p.arg[1])) if len(p.arg) > 1 else None
        if n is not None and n < 0:
            raise Refusal(self.line, f"{p.raw}: a negative length is not evaluated")
        many = p.name in ("@", "*") or p.index in ("@", "*")
        if not many:
            got = self.sh.get(p.name) if p.index is None else self._element(p)
            got = got if got is not None else self._unset(p, False)
            if got.unknown:
                return [(got, p.quoted, False)]
            text = got.text[off:] if off >= 0 else got.text[max(len(got.text) + off, 0) :]
            return [(Val(text[:n] if n is not None else text, assumed=got.assumed), p.quoted, False)]
        if p.name in ("@", "*"):
            items = ["$0", *self.sh.positional]
            if off == 0:
                raise Refusal(self.line, f"{p.raw}: $0 (the script's path) is not known")
            vals = [Val(a) for a in items]
        else:
            vals = list(self.sh.arrays.get(p.name, []))
        vals = vals[off:] if off >= 0 else vals[max(len(vals) + off, 0) :]
        vals = vals[:n] if n is not None else vals
        inner = Param(p.name if p.name in ("@", "*") else "__substr__", p.quoted, index=p.index)
        saved = self.sh.arrays.get("__substr__")
        self.sh.arrays["__substr__"] = vals
        try:
            if p.name in ("@", "*"):
                keep, self.sh.positional = self.sh.positional, [v.text for v in vals]
                try:
                    return self._many(inner)
                finally:
                    self.sh.positional = keep
            return self._many(inner)
        finally:
            if saved is None:
                self.sh.arrays.pop("__substr__", None)
            else:
                self.sh.arrays["__substr__"] = saved

    def _many(self, p: Param) -> list:
        """``$@``/``$*``/``${A[@]}``/``${A[*]}``: one field per element when quoted with @, else joined/split."""
        if p.name in ("@", "*"):
            items = [Val(a) for a in self.sh.positional]
        elif p.name in self.sh.arrays:
            items = list(self.sh.arrays[p.name])
        else:
            got = self.sh.get(p.name)
            items = [got] if got is not None else []
            if got is None and not self.sh.is_set(p.name):
                items = [v for v in [self._unset(p, p.op != "")] if v.text or v.unknown]
        if p.op == "length":
            return [(Val(str(len(items))), p.quoted, False)]
        if p.op:
            return [(self._apply(p, Val(" ".join(v.text for v in items)) if items else None), p.quoted, False)]
        if p.quoted and "*" in (p.name, p.index):
            joined = Val()
            for k, v in enumerate(items):
                joined = joined + (Val(" ") if k else Val()) + v
            return [(joined, True, False)]
        out: list = []
        for k, v in enumerate(items):
            if k:
                out.append(BREAK)
            out.append((v, p.quoted, False))
        if not items and p.quoted:
            out.append(BREAK)  # "${A[@]}" of nothing: no field at all
        return out

    # -- arithmetic -----------------------------------------------------------------------------------------------
    def arith(self, text: str) -> str:
        """``$((text))``: parameter expansion first, then integer arithmetic as bash computes it."""
        try:
            parts = lex_quoted(text, self.line)
        except BashSyntaxError as exc:
            raise Refusal(self.line, f"$(({_short(text)})): {exc.what}") from None
        v = self.value(parts)
        if v.unknown:
            raise _Unknown(v)
        return str(_Arith(v.text, self.sh, self.line).run())


class _Unknown(Exception):
    """An arithmetic expression over a value labkit does not know."""

    def __init__(self, val: Val) -> None:
        super().__init__(val.unknown)
        self.val = val


def _short(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= 60 else one[:57] + "..."


def _split(segs: list) -> list[Val]:
    """Join segments into fields: unquoted expansion results split at blanks; quoted ones never split."""
    fields: list[Val] = []
    cur: Val | None = None
    for seg in segs:
        if seg is BREAK:
            if cur is not None:
                fields.append(cur)
            cur = None
            continue
        val, quoted, literal = seg
        if quoted or literal or val.unknown:
            if val.unknown and not quoted and not literal:
                val = Val(val.text, val.unknown, val.assumed)  # unknown fields: one field, flagged
            cur = val if cur is None else cur + val
            continue
        pieces = re.split(f"[{re.escape(IFS)}]+", val.text)
        for k, piece in enumerate(pieces):
            if k:
                if cur is not None:
                    fields.append(cur)
                cur = None
            if piece:
                pv = Val(piece, assumed=val.assumed)
                cur = pv if cur is None else cur + pv
            elif val.assumed and cur is not None:
                cur = cur + Val("", assumed=val.assumed)
    if cur is not None:
        fields.append(cur)
    return fields


def match_pattern(word: str, pattern: str) -> bool:
    """A ``case`` pattern or ``[[ == ]]`` right side, as a glob (``*``, ``?``, ``[...]``)."""
    return fnmatch.fnmatchcase(word, pattern)


# -- integer arithmetic -------------------------------------------------------------------------------------------
_ATOM = re.compile(
    r"\s*(0[xX][0-9a-fA-F]+|\d+|[A-Za-z_][A-Za-z0-9_]*|\*\*|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%()<>!~?:^&|])"
)
_BIN = {
    "||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, ">": 7, "<=": 7, ">=": 7,
    "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10, "**": 11,
}  # fmt: skip


class _Arith:
    """A precedence-climbing evaluator of bash's integer expressions (64-bit, C division)."""

    def __init__(self, text: str, shell: Shell, line: int, depth: int = 0) -> None:
        self.toks, self.k, self.sh, self.line, self.depth = [], 0, shell, line, depth
        pos, text = 0, text.strip()
        while pos < len(text):
            m = _ATOM.match(text, pos)
            if not m:
                raise Refusal(line, f"$(({_short(text)})): cannot read {text[pos:].strip()[:20]!r}")
            self.toks.append(m.group(1))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.text = text

    def fail(self, what: str) -> Refusal:
        return Refusal(self.line, f"$(({_short(self.text)})): {what}")

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
            raise _Unknown(got)
        if not got.text.strip():
            return 0
        if self.depth > 16:
            raise self.fail(f"{name} refers to itself")
        return _Arith(got.text, self.sh, self.line, self.depth + 1).run()


def _wrap(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v
