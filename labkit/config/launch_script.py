"""A launch script (or a pasted command line) read as bash reads it, never executed: the arguments bash would pass
to verl's entry point (``python3 -m verl.trainer.main_ppo``, also under ``uv run``, ``torchrun``, ``ray job submit
--``, ``nohup``, a ``VAR=1`` prefix), each known exactly or marked unknown with the line and construct that decide it.

``read_script`` is the one reader of the CLI (``labkit read|check|plan|memory SCRIPT``) and of the dashboard.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from labkit.config.bash_expand import MARK, Refusal, Shell, Val
from labkit.config.bash_parse import parse
from labkit.config.bash_reader import Reader
from labkit.config.bash_tokens import BashSyntaxError

MAX_SCRIPT_BYTES = 128 * 2**10  # verl's longest example script is about 15 KB; read in well under a second at the cap
ENTRY = re.compile(r"^(verl|recipe)(\.\w+)*\.(main\w*|\w*_main)$")
_ENTRY_FILE = re.compile(r"(^|/)(verl|recipe)/(\w+/)*(main\w*|\w*_main)\.py$")
_OVERRIDE = re.compile(r"^(\+{0,2}[A-Za-z_][\w-]*(\.[\w-]+)*=|~[A-Za-z_][\w.-]*(=|$))")
_DOTTED = re.compile(r"^\+{0,2}[A-Za-z_][\w-]*\.[\w.-]*=|^[+~]")
_VERL_OVERRIDE = re.compile(
    r"^[+~]{0,2}(algorithm|data|actor_rollout_ref|critic|reward_model|reward|trainer)\.[\w.-]+="
)
"""A first argument that is one of verl's own overrides: what makes a script of another name a verl entry point."""


class LaunchError(ValueError):
    """A script labkit cannot read: syntax it cannot split, a construct it does not evaluate on the way to the
    launch, no verl launch reached, or a launch argument it cannot know; one line naming the line and construct."""


@dataclass(frozen=True)
class Arg:
    """One argument after the entry point: its text, or (``unknown``) why labkit cannot know it."""

    text: str
    unknown: str | None = None

    def shown(self) -> str:
        """The argument with each unknown part written as ``…``."""
        return self.text.replace(MARK, "…")


@dataclass
class ScriptRead:
    """What a script passes to verl: the entry point (``module``; None for a bare list of overrides), the line of
    the launch, the arguments, the variables read as unset to take the script's own default (``assumed``: name ->
    line) and the values taken from ``--set``."""

    module: str | None
    line: int
    args: list[Arg]
    launcher: list[str] = field(default_factory=list)
    assumed: dict[str, int] = field(default_factory=dict)
    from_caller: dict[str, str] = field(default_factory=dict)
    """Login-shell variables (HOME, USER, PWD) the script read, with the caller's values bash would use."""

    @property
    def exact(self) -> bool:
        return all(a.unknown is None for a in self.args)

    @property
    def unknown(self) -> list[Arg]:
        return [a for a in self.args if a.unknown is not None]

    def describe(self) -> str:
        """One line: where the launch is and what it calls."""
        what = f"python3 -m {self.module}" if self.module else "a list of overrides"
        via = f" (via {' '.join(self.launcher)})" if self.launcher else ""
        return f"line {self.line}: {what}{via}, {len(self.args)} argument(s)"

    def assumed_line(self) -> str:
        """The variables read as unset, and those taken from the caller's login environment, one line (empty when
        none)."""
        parts = []
        if self.from_caller:
            taken = ", ".join(f"{k}={v}" for k, v in sorted(self.from_caller.items()))
            parts.append(f"taken from your environment, as bash does: {taken}")
        if self.assumed:
            names = ", ".join(f"{k} (line {v})" for k, v in sorted(self.assumed.items(), key=lambda kv: kv[1]))
            parts.append(f"assumed unset in the caller's environment (the script's defaults apply): {names}")
        return "; ".join(parts)


def find_entry(fields: list[Val]) -> tuple[int, int, str | None] | None:
    """Where verl's entry point sits in a command's fields: (start of the entry point, first argument after it,
    the module or script; None for a bare list of overrides), or None. The entry point is ``-m MODULE`` with a verl
    or recipe main, a ``.../verl/trainer/main_ppo.py`` path, another ``.py`` whose first argument is one of verl's
    overrides (a custom entry point such as verl's split-placement ``main_ps.py``), or (a pasted command line) a
    first override."""
    for k, f in enumerate(fields):
        if f.unknown:
            continue
        nxt = fields[k + 1] if k + 1 < len(fields) else None
        if f.text == "-m" and nxt is not None and not nxt.unknown and ENTRY.match(nxt.text):
            return k, k + 2, nxt.text
        if k > 0 and _ENTRY_FILE.search(f.text):
            return k, k + 1, f.text
        if k > 0 and f.text.endswith(".py") and nxt is not None and not nxt.unknown and _VERL_OVERRIDE.match(nxt.text):
            return k, k + 1, f.text  # a custom entry point passed verl's overrides (verl's split-placement main_ps.py)
    first = fields[0]
    if not first.unknown and _OVERRIDE.match(first.text) and _DOTTED.match(first.text):
        return 0, 0, None
    return None


def read_script(
    text: str,
    extra: Iterable[str] = (),
    sets: Mapping[str, str] | None = None,
    env_complete: bool = False,
    login: Mapping[str, str] | None = None,
) -> ScriptRead:
    """The launch a script reaches: ``extra`` are the arguments given after the script (``$@``), ``sets`` the
    ``--set NAME=VALUE`` environment; ``env_complete``: no other variable is set (a scratch environment); ``login``:
    the caller's HOME, USER and PWD (``login_environment``), which bash takes from any login shell.
    LaunchError when the script cannot be read or reaches no verl launch."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SCRIPT_BYTES:
        raise LaunchError(f"labkit reads launch scripts of at most {MAX_SCRIPT_BYTES:,} bytes")
    if "\x00" in text:
        raise LaunchError("the script holds a NUL byte: not a shell script")
    try:
        stmts = parse(text.replace("\r\n", "\n"))
    except BashSyntaxError as exc:
        raise LaunchError(f"line {exc.line}: cannot parse: {exc.what}") from None
    except RecursionError:
        raise LaunchError("the script nests too deeply to read") from None
    shell = Shell(positional=list(extra), env=dict(sets or {}), env_complete=env_complete, login=dict(login or {}))
    reader = Reader(shell, lambda fields: find_entry(fields) is not None)
    try:
        launch = reader.run(stmts)
    except Refusal as exc:
        raise LaunchError(f"{exc}") from None
    except RecursionError:
        raise LaunchError("the script nests too deeply to read") from None
    if launch is None:
        why = f" (it exits at line {reader.exited})" if reader.exited else ""
        raise LaunchError(f"no verl launch (python3 -m verl.trainer.main_ppo ...) is reached{why}")
    start, first, module = find_entry(launch.argv)
    launcher = [f.text.replace(MARK, "…") for f in launch.argv[:start]]
    args = [Arg(f.text, f.unknown) for f in launch.argv[first:]]
    taken = {k: shell.login[k] for k in reader.sh.from_caller}
    return ScriptRead(module, launch.line, args, launcher, dict(reader.sh.assumed), taken)


def exact_args(read: ScriptRead) -> list[str]:
    """The arguments, all known (LaunchError naming the first unknown one and why)."""
    if read.unknown:
        first = read.unknown[0]
        more = f" (and {len(read.unknown) - 1} more argument(s))" if len(read.unknown) > 1 else ""
        raise LaunchError(f"{first.unknown}; it decides '{first.shown()}'{more}")
    return [a.text for a in read.args]


LOGIN_VARIABLES = ("HOME", "USER", "PWD")
"""Variables every login shell has, which a script may read without setting: bash takes them from the caller."""


def login_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's ``LOGIN_VARIABLES`` from ``environ`` (``os.environ`` for the command line)."""
    return {k: environ[k] for k in LOGIN_VARIABLES if k in environ}


def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """``--set NAME=VALUE`` options as a mapping (LaunchError for a malformed one)."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise LaunchError(f"--set {item!r}: expected NAME=VALUE (a shell variable name)")
        out[name] = value
    return out
