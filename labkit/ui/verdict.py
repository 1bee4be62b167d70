"""verl's verdict as a short card: code, verl's message verbatim, when it fires, why (the arithmetic), the fix.

``verdict_html(item)`` / ``verdict_text(item)`` take a validate ``Finding``, a ``VerlCheckError``, a ``Report`` (its
first error, or an OK card), a planner ``StageFailure``, another labkit error (``ConfigError``, ``PlanTooLarge``,
``LengthsError``) or one of the builtin errors labkit's verl mirrors raise with verl's text (looked up in the error
catalogue). ``expect_verl_error(code)`` runs a block that must fail the way verl fails, shows the card instead of a
traceback and asserts the code, so a notebook demonstrating an error still exits 0 under papermill.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from labkit.config.lengths import LengthsError
from labkit.config.messages import ConfigError
from labkit.config.yaml_input import YamlInputError
from labkit.rules.catalogue import CatalogueEntry, catalogue, code_of, message_fields
from labkit.rules.failures import StageFailure
from labkit.validate.report import Report, VerlCheckError
from labkit.validate.snapshot import ERROR, NOTICE, SILENT, Finding

__all__ = [
    "Verdict",
    "ExpectedError",
    "verdict_of",
    "verdict_html",
    "verdict_text",
    "show_verdict",
    "expect_verl_error",
]
DOCS = "../docs/errors.md"  # relative to notebooks/, where the cards are shown
_COLOURS = {"error": "#c33", "ok": "#2a7", SILENT: "#b80", NOTICE: "#57a", "input": "#888"}
_INPUT_ERRORS = (ConfigError, LengthsError, YamlInputError)


@dataclass
class Verdict:
    """What one card shows. ``kind``: error, ok, silent, notice, or input (labkit cannot read the config)."""

    kind: str
    code: str | None = None
    exc_type: str | None = None
    message: str = ""
    when: str = ""
    where: str = ""
    title: str = ""
    arithmetic: list[str] = field(default_factory=list)
    why: str = ""
    fixes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    others: list[tuple[str, str, str]] = field(default_factory=list)  # (severity, code, explanation) shown below
    expected: bool = False  # shown by expect_verl_error: the notebook demonstrates this error on purpose

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def _entry(code: str | None) -> CatalogueEntry | None:
    return catalogue().get(code) if code else None


def _others(findings: list[Finding], first: Finding | None) -> list[tuple[str, str, str]]:
    return [(f.severity, f.code, f.explanation) for f in findings if f is not first and f.severity in (SILENT, NOTICE)]


def _from_finding(f: Finding, others: list[tuple[str, str, str]] = ()) -> Verdict:
    e = _entry(f.code)
    return Verdict(
        kind="error" if f.severity == ERROR else f.severity,
        code=f.code,
        exc_type=f.exc_type,
        message=f.message,
        when=f.when,
        where=f.where,
        title=e.title if e else "",
        arithmetic=list(f.arithmetic),
        why=f.explanation or (e.why if e else ""),
        fixes=list(f.fixes),
        others=list(others),
    )


def _fields(e: CatalogueEntry, text: str) -> list[str]:
    """The values verl formatted into its message, as ``name = value`` lines (the arithmetic a plain error carries)."""
    return [f"{name} = {value}" for name, value in message_fields(e.code, text).items()]


def _from_builtin(exc: BaseException, code: str | None) -> Verdict | None:
    """A builtin error raised with verl's text (or a bare assert): its catalogue entry, None when none matches."""
    text = str(exc)
    found = code_of(text, (code,)) if code else code_of(text)
    if found is None or (not text and code is None):  # a bare assert matches every message-less code
        return None
    e = catalogue()[found]
    if e.exc_type and e.exc_type not in {t.__name__ for t in type(exc).__mro__}:
        return None
    return Verdict(
        kind="error",
        code=found,
        exc_type=e.exc_type,
        message=text,
        when=e.when,
        where=e.where,
        title=e.title,
        arithmetic=_fields(e, text),
        why=e.why,
    )


def verdict_of(item: Any) -> Verdict:
    """Normalise anything a card can show into a ``Verdict`` (see the module docstring)."""
    if isinstance(item, Verdict):
        return item
    if isinstance(item, Report):
        first = item.first_error
        others = _others(item.findings, first)
        if first is not None:
            return _from_finding(first, others)
        return Verdict(
            kind="ok",
            title=f"verl accepts this config ({item.profile} profile): it passes start-up, worker init and step 1",
            others=others,
        )
    if isinstance(item, Finding):
        return _from_finding(item)
    if isinstance(item, BaseException):
        notes = list(getattr(item, "__notes__", []) or [])
        if isinstance(item, VerlCheckError):
            v = _from_finding(item.finding)
            v.fixes = item.fixes()
        elif isinstance(item, StageFailure):
            e = _entry(item.code)
            v = Verdict(
                kind="error",
                code=item.code,
                exc_type=item.exc_type,
                message=item.message,
                when=e.when if e else "step 1",
                where=e.where if e else "",
                title=e.title if e else "",
                arithmetic=_fields(e, item.message) if e else [],
                why=e.why if e else "",
            )
        elif isinstance(item, _INPUT_ERRORS):
            v = Verdict(kind="input", exc_type=type(item).__name__, message=str(item), title="labkit cannot plan this")
        else:
            v = _from_builtin(item, None) or Verdict(kind="error", exc_type=type(item).__name__, message=str(item))
        v.notes = notes
        return v
    raise TypeError(f"cannot show a verdict for {type(item).__name__}")


def verdict_html(item: Any) -> str:
    """One card as HTML; the outer div carries ``data-verl-code`` (the code, or "ok") for tests and the dashboard."""
    v = verdict_of(item)
    esc = html.escape
    colour = _COLOURS.get(v.kind, "#c33")
    tag = v.code or ("ok" if v.ok else "none")
    expected = " data-verl-expected='true'" if v.expected else ""
    out = [
        f"<div class='labkit-verdict' data-verl-code='{esc(tag)}'{expected} style='border-left:4px solid {colour};"
        "padding:4px 10px;margin:4px 0;font-size:13px;line-height:1.4'>"
    ]
    if v.ok:
        out.append(f"<b style='color:{colour}'>OK</b> · {esc(v.title)}")
    else:
        code = f"<a href='{DOCS}#{v.code.lower()}'>{esc(v.code)}</a> · " if v.code else ""
        kind = v.exc_type or v.kind
        when = f" at <i>{esc(v.when)}</i>" if v.when else ""
        shown_as = "<span style='color:#888'>as expected, verl raises </span>" if v.expected else ""
        out.append(f"{shown_as}<b style='color:{colour}'>{code}{esc(kind)}</b>{when}")
        if v.title:
            out.append(f" · {esc(v.title)}")
        shown = v.message if v.message else "(a bare assert: verl prints no message)"
        out.append(f"<pre style='margin:4px 0;white-space:pre-wrap'>{esc(shown)}</pre>")
        if v.where:
            out.append(f"<div><b>where</b> <code>{esc(v.where)}</code></div>")
        if v.arithmetic:
            out.append(f"<div><b>why</b> <code>{'</code>; <code>'.join(esc(a) for a in v.arithmetic)}</code></div>")
        if v.why:
            out.append(f"<div>{esc(v.why)}</div>")
        if v.fixes:
            fixes = " <i>or</i> ".join(f"<code>{esc(x)}</code>" for x in v.fixes)
            out.append(f"<div><b>fix</b> {fixes}</div>")
    for note in v.notes:
        out.append(f"<div><i>{esc(note)}</i></div>")
    for severity, code, text in v.others:
        out.append(f"<div><b style='color:{_COLOURS[severity]}'>{esc(severity)} {esc(code)}</b> {esc(text)}</div>")
    return "".join(out) + "</div>"


def verdict_text(item: Any) -> str:
    """The same card as plain text (a terminal, a log, the text/plain part of the notebook output)."""
    v = verdict_of(item)
    if v.ok:
        lines = [f"OK: {v.title}"]
    else:
        head = ("expected: " if v.expected else "") + " ".join(x for x in (v.code, v.exc_type or v.kind) if x)
        lines = [head + (f" at {v.when}" if v.when else "") + (f": {v.title}" if v.title else "")]
        source = "labkit:" if v.kind == "input" else "verl: "
        lines.append(f"  {source} {v.message or '(a bare assert: verl prints no message)'}")
        if v.where:
            lines.append(f"  where: {v.where}")
        if v.arithmetic:
            lines.append("  why:   " + "; ".join(v.arithmetic))
        if v.why:
            lines.append(f"         {v.why}")
        if v.fixes:
            lines.append("  fix:   " + "  OR  ".join(v.fixes))
    lines += [f"  {note}" for note in v.notes]
    lines += [f"  {severity} {code}: {text}" for severity, code, text in v.others]
    return "\n".join(lines)


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with the notebook extra
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def show_verdict(item: Any) -> None:
    """Display the card: HTML (with its text as text/plain) in a notebook kernel, plain text elsewhere."""
    if _in_kernel():
        from IPython.display import display

        display({"text/html": verdict_html(item), "text/plain": verdict_text(item)}, raw=True)
    else:
        print(verdict_text(item))


class ExpectedError:
    """What ``expect_verl_error`` caught: ``.error`` (the exception), ``.finding`` (its record), ``.verdict``."""

    def __init__(self, code: str | None, fix: str | None, show: bool) -> None:
        self.code, self._fix, self._show = code, fix, show
        self.error: BaseException | None = None
        self.finding: Finding | None = None
        self.verdict: Verdict | None = None

    def __enter__(self) -> ExpectedError:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> bool:
        want = self.code or "a verl error"
        if exc is None:
            raise AssertionError(f"expected {want}, but the block raised nothing")
        if not isinstance(exc, Exception) or isinstance(exc, _INPUT_ERRORS):
            return False  # KeyboardInterrupt; a config labkit cannot read is no verl error: not ours to swallow
        if isinstance(exc, (VerlCheckError, StageFailure)):
            v = verdict_of(exc)
        elif isinstance(exc, (AssertionError, ValueError, TypeError, ZeroDivisionError, RuntimeError)):
            v = _from_builtin(exc, self.code)
            if v is not None:
                v.notes = list(getattr(exc, "__notes__", []) or [])
        else:
            return False  # NameError, ImportError, a ConfigError ...: the demonstration itself broke
        if v is None or (self.code is not None and v.code != self.code):
            got = f"{v.code} " if v is not None and v.code else ""
            raise AssertionError(f"expected {want}, got {got}{type(exc).__name__}: {exc}") from exc
        if self._fix and not v.fixes:
            v.fixes = [self._fix]
        v.expected = True
        self.error, self.verdict = exc, v
        self.finding = getattr(exc, "finding", None) or Finding(
            v.code or "", v.exc_type, v.message, v.when, v.where, list(v.arithmetic), v.why, list(v.fixes)
        )
        if self._show:
            show_verdict(v)
        return True


def expect_verl_error(code: str | None = None, *, fix: str | None = None, show: bool = True) -> ExpectedError:
    """Context manager: the block must raise verl's error ``code`` (any catalogued verl error when None).

    The card replaces the traceback; AssertionError when nothing is raised or another code is. Errors that are
    not verl's (NameError, ConfigError, ...) propagate unchanged. ``fix``: the fix to show for an error that carries
    none (a builtin raised by a mirror of verl's code, not by a config check).
    """
    return ExpectedError(code, fix, show)
