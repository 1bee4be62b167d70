"""Bash run statically, never executed: the statements of ``labkit.config.bash_parse`` evaluated over a ``Shell``
up to the first command that launches verl (``is_launch`` says which), so the launch's argv is what bash would pass.

External commands change no variable, so they are skipped (their exit status is unknown); builtins that change the
shell (assignments, ``export``, ``unset``, ``set``, ``shift``, ``cd``) are evaluated; ``source``, ``eval``, loops other
than ``for`` and functions are refused where the reader reaches them. A condition labkit cannot decide runs every
branch (``labkit.config.bash_branches``); ``$(...)`` runs in a sub-reader over a copy of the shell, and the
``env | awk`` idiom reads the environment (``labkit.config.bash_environment``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from labkit.config.bash_branches import Branches, Launch, _Launched
from labkit.config.bash_builtins import Builtins, ScriptExit
from labkit.config.bash_compound import ArithCmd, Case, Cond, For, Group, If, Unsupported
from labkit.config.bash_environment import ENV_NAMES, environment_names
from labkit.config.bash_expand import Expander, Refusal, Shell, UnknownValue, Val, match_pattern, unknown_val
from labkit.config.bash_parse import AndOr, Pipeline, Simple, parse
from labkit.config.bash_test import double_bracket
from labkit.config.bash_tokens import BashSyntaxError, Lit, Token

MAX_STEPS = 200_000  # statements evaluated (a for loop over a long list stays bounded)


class Reader(Branches, Builtins):
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
            return environment_names(self.sh, names.group("pattern"))
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


def _why_case(word: Val) -> str:
    return f"a case on a value labkit does not know ({word.unknown})" if word.unknown else "a case pattern"


def lit(tok: Token) -> str:
    """The literal text of a token's parts (for messages)."""
    return "".join(p.text for p in tok.parts if isinstance(p, Lit))
