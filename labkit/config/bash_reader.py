"""Bash run statically, never executed: the statements of ``labkit.config.bash_parse`` evaluated over a ``Shell``
up to the first command that launches verl (``is_launch`` says which), so the launch's argv is what bash would pass.

External commands change no variable, so they are skipped (their exit status is unknown); builtins that change the
shell (assignments, ``export``, ``unset``, ``set``, ``shift``, ``cd``) are evaluated; ``source``, ``eval``, loops other
than ``for`` and functions are refused where the reader reaches them. A condition labkit cannot decide runs every
branch on a copy of the shell and keeps what they agree on (a branch that exits never reaches the launch); a value
they disagree on becomes unknown, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from labkit.config.bash_expand import MARK, Expander, Refusal, Shell, Val, _Unknown, match_pattern, unknown_val
from labkit.config.bash_lex import BashSyntaxError, Lit, Token
from labkit.config.bash_parse import (
    _ASSIGN,
    AndOr,
    ArithCmd,
    Assign,
    Case,
    Cond,
    For,
    Group,
    If,
    Pipeline,
    Simple,
    Unsupported,
    _drop_lead,
    parse,
)

MAX_STEPS = 200_000  # statements evaluated (a for loop over a long list stays bounded)
_DECLARE = {"export", "declare", "typeset", "local", "readonly"}
_REFUSED = {"source": "source FILE (labkit reads one script)", ".": ". FILE (labkit reads one script)",
            "eval": "eval", "getopts": "getopts", "alias": "alias"}  # fmt: skip


@dataclass
class Launch:
    """The first command that launches verl: its line, every field (program first), the ``VAR=value`` prefix."""

    line: int
    argv: list[Val]
    env: dict[str, Val] = field(default_factory=dict)


class _Exit(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _Launched(Exception):
    def __init__(self, launch: Launch) -> None:
        self.launch = launch


class Reader:
    """Evaluates statements over ``shell``; ``is_launch(fields)`` tells which command launches verl."""

    def __init__(self, shell: Shell, is_launch: Callable[[list[Val]], bool]) -> None:
        self.sh, self.is_launch, self.steps = shell, is_launch, 0
        self.exited: int | None = None
        self.why = ""  # why the last undecided status is undecided
        self.depth = 0
        if shell.subst is None:
            shell.subst = self.substitute

    def substitute(self, text: str, line: int) -> Val | None:
        """``$(text)`` evaluated in a subshell when it only prints through echo/pwd/printf over known values (an
        external command's output is unknown); None when labkit cannot know it."""
        if self.depth > 8:
            return None
        try:
            stmts = parse(text)
        except (BashSyntaxError, RecursionError):
            return None
        sub = self.sh.copy()
        sub.out = []
        inner = Reader(sub, lambda fields: False)
        inner.depth = self.depth + 1
        try:
            inner.block(stmts)
        except _Exit:
            pass
        except (Refusal, _Launched, RecursionError):
            return None
        got = Val()
        for v in inner.sh.out or []:
            got = got + v
        return None if got.unknown else Val(got.text.rstrip("\n"), assumed=got.assumed)

    def run(self, stmts: list) -> Launch | None:
        """The launch bash reaches, or None (``exited``: the line of the ``exit`` that ended the script)."""
        try:
            self.block(stmts)
        except _Launched as got:
            return got.launch
        except _Exit as ex:
            self.exited = ex.line
        return None

    # -- statements -----------------------------------------------------------------------------------------------
    def block(self, stmts: list) -> int | None:
        status: int | None = 0
        for st in stmts:
            status = self.stmt(st)
        return status

    def stmt(self, st) -> int | None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise Refusal(getattr(st, "line", 0), f"more than {MAX_STEPS:,} statements evaluated")
        if isinstance(st, AndOr):
            return self.and_or(st)
        if isinstance(st, Pipeline):
            return self.pipeline(st)
        if isinstance(st, Simple):
            return self.simple(st)
        if isinstance(st, If):
            return self.if_(st, 0)
        if isinstance(st, Case):
            return self.case(st)
        if isinstance(st, For):
            return self.for_(st)
        if isinstance(st, Group):
            return self.group(st)
        if isinstance(st, Cond):
            return self.cond(st)
        if isinstance(st, ArithCmd):
            return self.arith_cmd(st)
        if isinstance(st, Unsupported):
            raise Refusal(st.line, f"{st.what} (labkit does not evaluate it)")
        raise Refusal(getattr(st, "line", 0), f"{type(st).__name__} is not evaluated")

    def and_or(self, st: AndOr) -> int | None:
        status = self.pipeline(st.items[0][1])
        for conn, p in st.items[1:]:
            if status is None:
                why = self.why or "a command whose exit status is unknown"
                status = self.explore([lambda p=p: self.pipeline(p), lambda: None], p.line, why)
            elif (conn == "&&") == (status == 0):
                status = self.pipeline(p)
        return status

    def pipeline(self, p: Pipeline) -> int | None:
        if len(p.commands) == 1:
            status = self.stmt(p.commands[0])
        else:  # each part runs in a subshell: a launch counts, assignments are lost
            keep, last = self.sh, None
            for cmd in p.commands:
                self.sh = keep.copy()
                if keep.out is not None:
                    self.sh.out = []  # only the last command's output leaves the pipe
                try:
                    status = self.stmt(cmd)
                except _Exit:
                    status = None
                last = self.sh.out
            self.sh = keep
            if keep.out is not None:
                keep.out.extend(last or [])
        if p.negate and status is not None:
            return int(status == 0)
        return status

    def group(self, g: Group) -> int | None:
        if not g.subshell:
            return self.block(g.body)
        keep, self.sh = self.sh, self.sh.copy()
        try:
            return self.block(g.body)
        except _Exit:
            return None
        finally:
            self.sh = keep

    # -- branches -------------------------------------------------------------------------------------------------
    def explore(self, branches: list[Callable[[], int | None]], line: int, why: str) -> int | None:
        """Run each branch on a copy of the shell; keep the variables every surviving branch agrees on."""
        base, survivors = self.sh, []
        for fn in branches:
            self.sh = base.copy()
            try:
                survivors.append((self.sh, fn()))
            except _Exit:
                continue
            except _Launched as got:
                self.sh = base
                raise Refusal(got.launch.line, f"the launch depends on line {line}: {why}") from None
        if not survivors:
            self.sh = base
            raise _Exit(line)
        self.sh = _merge([s for s, _ in survivors], f"line {line}: {why}")
        statuses = {st for _, st in survivors}
        return statuses.pop() if len(statuses) == 1 else None

    def if_(self, st: If, k: int) -> int | None:
        if k == len(st.clauses):
            return self.block(st.orelse) if st.orelse is not None else 0
        cond, body = st.clauses[k]
        status = self.block(cond)
        if status == 0:
            return self.block(body)
        if status is not None:
            return self.if_(st, k + 1)
        why = f"an if on {self.why}" if self.why else "an if whose condition labkit cannot decide"
        return self.explore([lambda: self.block(body), lambda: self.if_(st, k + 1)], st.line, why)

    def case(self, st: Case) -> int | None:
        ex = Expander(self.sh, st.line)
        word = ex.value(st.word.parts)
        undecided: list[Callable[[], int | None]] = []
        for pats, body in st.items:
            for pat in pats:
                pattern, known = self.pattern(pat, st.line)
                if word.unknown or not known:
                    undecided.append(lambda body=body: self.block(body))
                    break
                if match_pattern(word.text, pattern):
                    if not undecided:
                        return self.block(body)
                    undecided.append(lambda body=body: self.block(body))
                    return self.explore(undecided, st.line, _why_case(word))
        if not undecided:
            return 0
        return self.explore([*undecided, lambda: 0], st.line, _why_case(word))

    def pattern(self, tok: Token, line: int) -> tuple[str, bool]:
        """A case pattern as a glob: quoted characters match themselves; (pattern, known)."""
        out, known = [], True
        for val, quoted, _lit in (s for s in Expander(self.sh, line).segments(tok.parts) if isinstance(s, tuple)):
            known = known and not val.unknown
            text = val.text
            out.append(re.sub(r"([*?\[])", r"[\1]", text) if quoted else text)
        return "".join(out), known

    def for_(self, st: For) -> int | None:
        ex = Expander(self.sh, st.line)
        words = (
            [Val(a) for a in self.sh.positional] if st.words is None else [f for w in st.words for f in ex.fields(w)]
        )
        if any(w.unknown for w in words):
            why = next(w.unknown for w in words if w.unknown)

            def once() -> int | None:
                self.sh.scalars[st.var] = unknown_val(f"the loop at line {st.line} runs over {why}")
                return self.block(st.body)

            return self.explore([once, lambda: 0], st.line, f"a for loop over {why}")
        status: int | None = 0
        for w in words:
            self.sh.scalars[st.var] = w
            status = self.block(st.body)
        return status

    # -- conditions -----------------------------------------------------------------------------------------------
    def cond(self, st: Cond) -> int | None:
        from labkit.config.bash_test import double_bracket

        return self.decided(double_bracket(st.tokens, Expander(self.sh, st.line)))

    def decided(self, got: bool | str) -> int | None:
        """A test's exit status, or None with ``why`` when labkit cannot decide it."""
        if isinstance(got, str):
            self.why = got
            return None
        return int(not got)

    def arith_cmd(self, st: ArithCmd) -> int | None:
        ex = Expander(self.sh, st.line)
        try:
            return int(int(ex.arith(st.token.parts[0].text)) == 0)
        except _Unknown as exc:
            self.why = str(exc.val.unknown)
            return None

    # -- simple commands ------------------------------------------------------------------------------------------
    def simple(self, cmd: Simple) -> int | None:
        ex = Expander(self.sh, cmd.line)
        if not cmd.words:
            for a in cmd.assigns:
                self.assign(a, ex, cmd.line)
            return 0
        fields = [f for w in cmd.words for f in Expander(self.sh, w.line).fields(w)]  # each word's own line
        prefix = {a.name: ex.value(a.value.parts) if a.value is not None else Val() for a in cmd.assigns}
        if fields and fields[0].text == "exec" and not fields[0].unknown:
            fields = fields[1:]
        if not fields:
            return 0
        if self.is_launch(fields):
            raise _Launched(Launch(cmd.line, fields, prefix))
        name = fields[0].text if not fields[0].unknown else ""
        return self.builtin(name, fields[1:], cmd, ex)

    def builtin(self, name: str, args: list[Val], cmd: Simple, ex: Expander) -> int | None:
        line = cmd.line
        if name in _REFUSED:
            raise Refusal(line, f"{_REFUSED[name]} (labkit does not evaluate it)")
        if name in ("exit", "return"):
            raise _Exit(line)
        if name in ("true", ":"):
            return 0
        if name == "false":
            return 1
        if name in ("[", "test"):
            from labkit.config.bash_test import single_bracket

            return self.decided(single_bracket(args[:-1] if name == "[" and args and args[-1].text == "]" else args))
        if name in _DECLARE:
            return self.declare(name, cmd, ex)
        if name == "unset":
            for a in args:
                if a.unknown:
                    raise Refusal(line, f"unset of a name labkit does not know ({a.unknown})")
                if not a.text.startswith("-"):
                    self.sh.scalars.pop(a.text, None)
                    self.sh.arrays.pop(a.text, None)
                    self.sh.env = {k: v for k, v in self.sh.env.items() if k != a.text}
            return 0
        if name == "set":
            return self.set_(args, line)
        if name == "shift":
            n = int(args[0].text) if args and args[0].text.isdigit() else 1
            self.sh.positional = self.sh.positional[n:]
            return 0
        if name in ("cd", "pushd", "popd"):
            for var in ("PWD", "OLDPWD"):
                self.sh.scalars[var] = unknown_val(f"line {line}: {name} changes ${var}")
            self.why = f"whether {name} succeeds"
            return None
        if name in ("read", "mapfile", "readarray") or (name == "printf" and any(a.text == "-v" for a in args)):
            for a in args:
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", a.text):
                    self.sh.scalars[a.text] = unknown_val(f"line {line}: {name} sets ${a.text}")
            self.why = f"whether {name} succeeds"
            return None
        if name in ("echo", "pwd", "printf") and self.sh.out is not None:
            return self.prints(name, args, cmd)
        if self.sh.out is not None and not _stdout_redirected(cmd):
            self.sh.out.append(unknown_val(f"line {line}: the output of {name or 'a command'}"))
        self.why = f"the exit status of {name or 'a command'} (line {line})"
        return None  # an external command: it changes no variable; its exit status is not known

    def prints(self, name: str, args: list[Val], cmd: Simple) -> int:
        """echo / pwd / printf (a format without %) inside a command substitution."""
        if _stdout_redirected(cmd):
            return 0
        if name == "pwd":
            got = self.sh.get("PWD") or unknown_val(f"line {cmd.line}: pwd (the current directory)")
            self.sh.out.append(got + Val("\n"))
            return 0
        if name == "printf":
            fmt = args[0] if args else Val()
            ok = not fmt.unknown and "%" not in fmt.text and "\\" not in fmt.text and len(args) == 1
            self.sh.out.append(fmt if ok else unknown_val(f"line {cmd.line}: printf with a format"))
            return 0
        newline = True
        while args and args[0].text in ("-n", "-e", "-E") and not args[0].unknown:
            newline, flag = newline and args[0].text != "-n", args[0].text
            args = args[1:]
            if flag == "-e" and any("\\" in a.text for a in args):
                self.sh.out.append(unknown_val(f"line {cmd.line}: echo -e with escapes"))
                return 0
        joined = Val()
        for k, a in enumerate(args):
            joined = joined + (Val(" ") if k else Val()) + a
        self.sh.out.append(joined + Val("\n" if newline else ""))
        return 0

    def set_(self, args: list[Val], line: int) -> int:
        k = 0
        while k < len(args):
            a = args[k].text
            if a == "--":
                self.sh.positional = [v.text for v in args[k + 1 :]]
                return 0
            if a in ("-o", "+o") and k + 1 < len(args):
                if args[k + 1].text == "nounset":
                    self.sh.nounset = a == "-o"
                k += 2
                continue
            if a[:1] in "-+" and len(a) > 1:
                if "u" in a[1:]:
                    self.sh.nounset = a[0] == "-"
                if "o" in a[1:] and k + 1 < len(args):  # -euo pipefail: the o takes the next word
                    if args[k + 1].text == "nounset":
                        self.sh.nounset = a[0] == "-"
                    k += 1
            elif a:
                self.sh.positional = [v.text for v in args[k:]]
                return 0
            k += 1
        return 0

    def declare(self, name: str, cmd: Simple, ex: Expander) -> int:
        for tok in cmd.words[1:]:
            m = _ASSIGN.match(tok.lead())
            if m:
                value = _drop_lead(tok, len(m.group(0)))
                self.assign(Assign(m.group(1), bool(m.group(3)), value, index=m.group(2)), ex, cmd.line)
                continue
            fields = ex.fields(tok)
            for f in fields:
                if f.text.startswith("-") and name != "export" and set(f.text[1:]) & set("Aainr"):
                    raise Refusal(cmd.line, f"{name} {f.text} (an attribute labkit does not model)")
        return 0

    def assign(self, a: Assign, ex: Expander, line: int) -> None:
        if a.index is not None and a.array is None:
            raise Refusal(line, f"{a.name}[{a.index}]= (an array element assignment)")
        if a.array is not None:
            items = [f for w in a.array for f in Expander(self.sh, w.line).fields(w)]
            items = [self.from_set(a.name, v, line) if v.unknown else v for v in items]
            if a.append:
                base = self.sh.arrays.get(a.name)
                if base is None:
                    got = self.sh.scalars.get(a.name)
                    base = [got] if got is not None else []
                items = list(base) + items
            self.sh.scalars.pop(a.name, None)
            self.sh.arrays[a.name] = items
            return
        value = ex.value(a.value.parts) if a.value is not None else Val()
        if value.unknown:
            value = self.from_set(a.name, value, line)
        if a.append:
            if a.name in self.sh.arrays:
                self.sh.arrays[a.name].append(value)
                return
            value = (self.sh.get(a.name) or Val()) + value
        self.sh.arrays.pop(a.name, None)
        self.sh.scalars[a.name] = value

    def from_set(self, name: str, value: Val, line: int) -> Val:
        """An unknown value the caller supplied with ``--set NAME=VALUE`` (recorded as assumed), else unchanged."""
        if name in self.sh.env:
            self.sh.assumed.setdefault(f"{name} (--set, for {value.unknown})", line)
            return Val(self.sh.env[name], assumed=frozenset([name]))
        return value


def _merge(shells: list[Shell], why: str) -> Shell:
    """One shell from the branches' shells: values they agree on stay; others become unknown, with ``why``."""
    out = shells[0].copy()
    if len(shells) == 1:
        return out
    for name in {n for s in shells for n in s.scalars} | {n for s in shells for n in s.arrays}:
        values = [s.arrays[name] if name in s.arrays else s.scalars.get(name) for s in shells]
        if all(v == values[0] for v in values[1:]):
            continue
        reason = f"${name} depends on {why}"
        if all(isinstance(v, list) and len(v) == len(values[0]) for v in values):  # arrays: element by element
            out.scalars.pop(name, None)
            out.arrays[name] = [_common([v[k] for v in values], reason) for k in range(len(values[0]))]
            continue
        out.arrays.pop(name, None)
        known = [v for v in values if isinstance(v, Val)]
        out.scalars[name] = _common(known, reason) if len(known) == len(values) else unknown_val(reason)
    for s in shells[1:]:
        for k, v in s.assumed.items():
            out.assumed.setdefault(k, v)
        out.nounset = out.nounset or s.nounset
    if any(s.out != out.out for s in shells):
        out.out = [unknown_val(f"what is printed depends on {why}")]
    if any(s.positional != out.positional for s in shells):
        raise Refusal(0, f"the positional parameters depend on {why}")
    return out


def _common(vals: list[Val], why: str) -> Val:
    """One value for values that differ: the text they all start with, then an unknown part (so the key of
    ``key=value`` stays known when only the value differs)."""
    if all(v == vals[0] for v in vals[1:]):
        return vals[0]
    first = vals[0].text
    n = 0
    while n < len(first) and all(n < len(v.text) and v.text[n] == first[n] for v in vals[1:]):
        n += 1
    prefix = first[:n].split(MARK, 1)[0]
    return Val(prefix + MARK, unknown=next((v.unknown for v in vals if v.unknown), why))


def _why_case(word: Val) -> str:
    return f"a case on a value labkit does not know ({word.unknown})" if word.unknown else "a case pattern"


def lit(tok: Token) -> str:
    """The literal text of a token's parts (for messages)."""
    return "".join(p.text for p in tok.parts if isinstance(p, Lit))


def _stdout_redirected(cmd: Simple) -> bool:
    return any(op in (">", "1>", ">>", "1>>", "&>", "&>>", ">|") for op, _ in cmd.redirs)
