"""The builtins a launch script uses that change the shell (``export``, ``declare``, ``unset``, ``set``, ``shift``,
``cd``, assignments), those that print inside ``$(...)`` (``echo``, ``pwd``, ``printf``) and those refused
(``source``, ``eval``, ...): the ``Builtins`` half of ``labkit.config.bash_reader.Reader``. Any other command is
external: it changes no variable and its exit status is not known."""

from __future__ import annotations

import re

from labkit.config.bash_expand import Expander, Refusal, Shell, Val, unknown_val
from labkit.config.bash_parse import _ASSIGN, Assign, Simple, _drop_lead
from labkit.config.bash_test import integer_expected, single_bracket

_DECLARE = {"export", "declare", "typeset", "local", "readonly"}
_REFUSED = {"source": "source FILE (labkit reads one script)", ".": ". FILE (labkit reads one script)",
            "eval": "eval", "getopts": "getopts", "alias": "alias"}  # fmt: skip


class ScriptExit(Exception):
    """``exit`` (or ``return`` at the top level): the script ends at ``line``."""

    def __init__(self, line: int) -> None:
        self.line = line


class Builtins:
    """Builtins over ``self.sh``; ``self.why`` says why the last exit status is undecided."""

    sh: Shell
    why: str

    def decided(self, got: bool | str) -> int | None:
        """A test's exit status, or None with ``why`` when labkit cannot decide it."""
        if isinstance(got, str):
            self.why = got
            return None
        return int(not got)

    def builtin(self, name: str, args: list[Val], cmd: Simple, ex: Expander) -> int | None:
        line = cmd.line
        if name in _REFUSED:
            raise Refusal(line, f"{_REFUSED[name]} (labkit does not evaluate it)")
        if name in ("exit", "return"):
            raise ScriptExit(line)
        if name in ("true", ":"):
            return 0
        if name == "false":
            return 1
        if name in ("[", "test"):
            inner = args[:-1] if name == "[" and args and args[-1].text == "]" else args
            return 2 if integer_expected(inner) else self.decided(single_bracket(inner))
        if name in _DECLARE:
            return self.declare(name, cmd, ex)
        if name == "unset":
            for a in args:
                if a.unknown:  # any variable set so far may be the one: each reads as unknown until set again
                    self.doubt_every_variable(f"line {line}: an unset of a name labkit does not know may unset it")
                    continue
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

    def doubt_every_variable(self, why: str) -> None:
        """Every variable the script or its caller set so far (scalars, arrays, the environment, the login's) reads
        as unknown, ``why`` naming the statement, until the script sets it again: what an unset of names labkit
        cannot know (``for v in $(env | ...); do unset "$v"; done``) may have removed."""
        names = {*self.sh.scalars, *self.sh.arrays, *self.sh.env, *self.sh.login}
        for var in names:
            self.sh.arrays.pop(var, None)
            self.sh.scalars[var] = unknown_val(f"{why} (${var})")

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
        if "--set " in value.unknown:  # already names the variable that answers it
            return value
        return unknown_val(f"{value.unknown}; it sets ${name}: pass --set {name}=VALUE{_probe_hint(value.unknown)}")


def _probe_hint(why: str) -> str:
    """For the device probe of verl's scripts (``import torch_npu`` ... ``echo npu || echo gpu``): what a CUDA
    machine prints."""
    if "torch_npu" in why:
        return " (a CUDA machine gives gpu)"
    return ""


def _stdout_redirected(cmd: Simple) -> bool:
    return any(op in (">", "1>", ">>", "1>>", "&>", "&>>", ">|") for op, _ in cmd.redirs)
