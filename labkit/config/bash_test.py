"""``[ ... ]``/``test`` and ``[[ ... ]]`` decided statically: True, False, or a string saying why labkit cannot decide
(a value it does not know, a test of the file system, a regular expression)."""

from __future__ import annotations

from labkit.config.bash_expand import Expander, Val, match_pattern
from labkit.config.bash_tokens import Lit, Param, Token

_FILE_TESTS = set("abcdefghkprstuwxGLNOS")
_INT_OPS = {"-eq": "==", "-ne": "!=", "-lt": "<", "-le": "<=", "-gt": ">", "-ge": ">="}
Decision = "bool | str"


def _int(v: Val) -> int | str:
    text = v.text.strip()
    if v.unknown:
        return v.unknown
    try:
        return int(text)
    except ValueError:
        return f"'{text}' is not an integer"


def _binary(a: Val, op: str, b: Val, pattern: bool = False) -> bool | str:
    if a.unknown or b.unknown:
        return a.unknown or b.unknown
    if op in ("=", "=="):
        return match_pattern(a.text, b.text) if pattern else a.text == b.text
    if op == "!=":
        return not (match_pattern(a.text, b.text) if pattern else a.text == b.text)
    if op == "<":
        return a.text < b.text
    if op == ">":
        return a.text > b.text
    if op in _INT_OPS:
        x, y = _int(a), _int(b)
        if isinstance(x, str) or isinstance(y, str):
            return x if isinstance(x, str) else y
        return {"==": x == y, "!=": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[_INT_OPS[op]]
    if op == "=~":
        return "a regular expression match (=~)"
    return f"the test operator {op}"


def _unary(op: str, a: Val) -> bool | str:
    if op in ("-z", "-n"):
        if a.unknown:
            return a.unknown
        return (a.text == "") == (op == "-z")
    if op == "-v":
        return f"-v {a.text} (whether a variable is set)"
    if len(op) == 2 and op[1] in _FILE_TESTS:
        return f"the file test {op} {a.text or '...'} (labkit does not look at files)"
    return f"the test operator {op}"


def integer_expected(args: list[Val]) -> bool:
    """``[ X -eq Y ]`` with a known X or Y that is not an integer: bash prints "integer expression expected" and the
    test exits 2 (the if takes its else). Only the plain three-word form: under ``!``, ``-a`` or ``-o`` labkit
    leaves it undecided."""
    if len(args) != 3 or args[1].unknown or args[1].text not in _INT_OPS or args[0].unknown or args[2].unknown:
        return False
    return isinstance(_int(args[0]), str) or isinstance(_int(args[2]), str)


def single_bracket(args: list[Val]) -> bool | str:
    """``[ args ]``: ``!``, one, two and three arguments, and ``-a``/``-o`` joining them."""
    words = [a.text if not a.unknown else None for a in args]
    for joiner, fn in (("-o", any), ("-a", all)):
        if joiner in words and len(args) > 3:
            k = words.index(joiner)
            left, right = single_bracket(args[:k]), single_bracket(args[k + 1 :])
            if isinstance(left, bool) and isinstance(right, bool):
                return fn((left, right))
            return left if isinstance(left, str) else right
    if words and words[0] == "!" and len(args) != 3:
        got = single_bracket(args[1:])
        return (not got) if isinstance(got, bool) else got
    if not args:
        return False
    if len(args) == 1:
        return args[0].unknown or args[0].text != ""
    if len(args) == 2:
        return _unary(words[0] or "", args[1]) if words[0] else args[0].unknown
    if len(args) == 3:
        if words[1] in ("=", "==", "!=", "<", ">", *_INT_OPS):
            return _binary(args[0], words[1], args[2])
        if words[0] == "!":
            got = single_bracket(args[1:])
            return (not got) if isinstance(got, bool) else got
    return "a [ ] test labkit cannot read"


def double_bracket(tokens: list[Token], ex: Expander) -> bool | str:
    """``[[ ... ]]``: words are not split; ``==``/``!=`` take an unquoted right side as a pattern."""
    pos = [0]

    def peek() -> Token | None:
        return tokens[pos[0]] if pos[0] < len(tokens) else None

    def word(tok: Token) -> str | None:
        return tok.literal() if tok.is_word and all(not p.quoted for p in tok.parts) else None

    def primary() -> bool | str:
        tok = peek()
        if tok is None:
            return "an empty [[ ]]"
        if word(tok) == "!":
            pos[0] += 1
            got = primary()
            return (not got) if isinstance(got, bool) else got
        if tok.op == "(":
            pos[0] += 1
            got = disjunction()
            if peek() is None or peek().op != ")":
                return "a '(' in [[ ]] that is never closed"
            pos[0] += 1
            return got
        toks = []
        while peek() is not None and peek().op not in ("&&", "||", ")"):
            toks.append(peek())
            pos[0] += 1
        ops = [word(t) if t.is_word else t.op for t in toks]
        if len(toks) == 1:
            v = ex.value(toks[0].parts)
            return v.unknown or v.text != ""
        if len(toks) == 2:
            return _unary(ops[0] or "", ex.value(toks[1].parts))
        if len(toks) == 3:
            right = toks[2]
            pattern = _pattern(right, ex)
            return _binary(ex.value(toks[0].parts), ops[1] or "", pattern, pattern=ops[1] in ("=", "==", "!="))
        return "a [[ ]] test labkit cannot read"

    def conjunction() -> bool | str:
        left = primary()
        while peek() is not None and peek().op == "&&":
            pos[0] += 1
            right = primary()
            left = _join(left, right, all)
        return left

    def disjunction() -> bool | str:
        left = conjunction()
        while peek() is not None and peek().op == "||":
            pos[0] += 1
            right = conjunction()
            left = _join(left, right, any)
        return left

    got = disjunction()
    return got if pos[0] == len(tokens) else "a [[ ]] test labkit cannot read"


def _join(a: bool | str, b: bool | str, fn) -> bool | str:
    if isinstance(a, bool) and isinstance(b, bool):
        return fn((a, b))
    if fn is all and (a is False or b is False):
        return False
    if fn is any and (a is True or b is True):
        return True
    return a if isinstance(a, str) else b


def _pattern(tok: Token, ex: Expander) -> Val:
    """The right side of ``==`` as a glob: quoted characters match themselves."""
    out = Val()
    for part in tok.parts:
        v = ex.value([part])
        quoted = isinstance(part, (Lit, Param)) and part.quoted
        text = "".join(f"[{c}]" if c in "*?[" else c for c in v.text) if quoted else v.text
        out = out + Val(text, v.unknown, v.assumed)
    return out
