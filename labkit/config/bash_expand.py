"""Bash's expansions, statically: a word of ``labkit.config.bash_lex`` becomes the fields bash would pass, over a
``Shell`` of known variables. A value labkit cannot know (a command substitution, a variable only the caller's
environment sets) is carried as ``Val.unknown`` with the reason, never guessed; a variable read as unset to take the
script's own default is recorded in ``Val.assumed``.
"""

from __future__ import annotations

import fnmatch
import re

from labkit.config.bash_arith import ArithEval
from labkit.config.bash_lex import lex_quoted
from labkit.config.bash_tokens import Arith, BashSyntaxError, CmdSub, Lit, Param, Token
from labkit.config.bash_values import IFS, MARK, Refusal, Shell, UnknownValue, Val, short, unknown_val

__all__ = ["MARK", "Expander", "Refusal", "Shell", "UnknownValue", "Val", "match_pattern", "unknown_val"]

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
                except UnknownValue as exc:  # an index or offset over an unknown value
                    segs.append((unknown_val(str(exc.val.unknown)), p.quoted, False))
            elif isinstance(p, CmdSub):
                got = self.sh.subst(p.text, self.line) if self.sh.subst is not None else None
                if got is None or got.unknown:
                    got = unknown_val(f"line {self.line}: command substitution $({short(p.text)}) is not run")
                segs.append((got, p.quoted, False))
            elif isinstance(p, Arith):
                try:
                    segs.append((Val(self.arith(p.text)), p.quoted, False))
                except UnknownValue as exc:
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
            raise Refusal(self.line, f"$(({short(text)})): {exc.what}") from None
        v = self.value(parts)
        if v.unknown:
            raise UnknownValue(v)
        return str(ArithEval(v.text, self.sh, self.line).run())


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
