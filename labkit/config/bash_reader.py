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

from labkit.config.bash_builtins import Builtins, ScriptExit
from labkit.config.bash_expand import MARK, Expander, Refusal, Shell, UnknownValue, Val, match_pattern, unknown_val
from labkit.config.bash_lex import BashSyntaxError, Lit, Token
from labkit.config.bash_parse import (
    AndOr,
    ArithCmd,
    Case,
    Cond,
    For,
    Group,
    If,
    Pipeline,
    Simple,
    Unsupported,
    parse,
)
from labkit.config.bash_test import double_bracket

MAX_STEPS = 200_000  # statements evaluated (a for loop over a long list stays bounded)


@dataclass
class Launch:
    """The first command that launches verl: its line, every field (program first), the ``VAR=value`` prefix."""

    line: int
    argv: list[Val]
    env: dict[str, Val] = field(default_factory=dict)


class _Launched(Exception):
    def __init__(self, launch: Launch) -> None:
        self.launch = launch


ENV_NAMES = re.compile(
    r"""^\s*env\s*\|\s*awk\s+-F\s*['"]?=['"]?\s+'/(?P<pattern>[^/']+)/\s*\{\s*print\s+\$1;?\s*\}'\s*$"""
)
"""The idiom verl's TensorRT-LLM scripts clean the environment with: the names of the variables a pattern matches."""
BASH_EXPORTS = ("SHLVL", "_", "PWD", "OLDPWD")
"""What bash itself exports into ``env``'s output."""


class Reader(Builtins):
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
        names = ENV_NAMES.match(text)
        if names:
            return self.environment_names(names.group("pattern"))
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
        except ScriptExit:
            pass
        except (Refusal, _Launched, RecursionError):
            return None
        got = Val()
        for v in inner.sh.out or []:
            got = got + v
        return None if got.unknown else Val(got.text.rstrip("\n"), assumed=got.assumed)

    def environment_names(self, pattern: str) -> Val | None:
        """``env | awk -F= '/PATTERN/{print $1}'``: the names of the exported variables PATTERN matches, known only in
        an environment the caller vouches for whole, and when no variable the script set could be among them."""
        try:
            rx = re.compile(pattern)
        except re.error:
            return None
        set_here = {*self.sh.scalars, *self.sh.arrays, *BASH_EXPORTS}
        if not self.sh.env_complete or any(rx.search(name) for name in set_here):
            return None
        return Val("\n".join(sorted(name for name in {*self.sh.env, *self.sh.login} if rx.search(name))))

    def run(self, stmts: list) -> Launch | None:
        """The launch bash reaches, or None (``exited``: the line of the ``exit`` that ended the script)."""
        try:
            self.block(stmts)
        except _Launched as got:
            return got.launch
        except ScriptExit as ex:
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
                except ScriptExit:
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
        except ScriptExit:
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
            except ScriptExit:
                continue
            except _Launched as got:
                self.sh = base
                raise Refusal(got.launch.line, f"the launch depends on line {line}: {why}") from None
        if not survivors:
            self.sh = base
            raise ScriptExit(line)
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
        return self.decided(double_bracket(st.tokens, Expander(self.sh, st.line)))

    def arith_cmd(self, st: ArithCmd) -> int | None:
        ex = Expander(self.sh, st.line)
        try:
            return int(int(ex.arith(st.token.parts[0].text)) == 0)
        except UnknownValue as exc:
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
