"""The status line of a live run started from a notebook button: what runs now (stage by stage, with the seconds
since the button), then how it ended, "done in 12.3 s" or "failed after 3.1 s: the error". It always ends: a
run that raises leaves the error on the line, never "starting…".
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterator
from contextlib import contextmanager

import ipywidgets as W

_COLOURS = {"running": "#57a", "done": "#2a7", "failed": "#c33"}


class LiveStatus:
    """One line of HTML; ``stage(text)`` is the callback the live runs take (``on_stage``)."""

    def __init__(self) -> None:
        self.widget = W.HTML()
        self.state = "idle"
        self._t0 = time.perf_counter()

    def _show(self, state: str, text: str) -> None:
        self.state = state
        seconds = time.perf_counter() - self._t0
        head = {"running": f"running, {seconds:.1f} s", "done": f"done in {seconds:.1f} s"}.get(
            state, f"failed after {seconds:.1f} s"
        )
        self.widget.value = f"<b style='color:{_COLOURS[state]}'>{head}</b> · {html.escape(text)}"

    def stage(self, text: str) -> None:
        self._show("running", text)

    def done(self, text: str = "") -> None:
        self._show("done", text)

    def failed(self, exc: BaseException) -> None:
        self._show("failed", f"{type(exc).__name__}: {exc}")

    @contextmanager
    def run(self, first: str, button: W.Button | None = None) -> Iterator[LiveStatus]:
        """Time the block from ``first``; on success the block calls ``done``; an exception is shown and kept."""
        self._t0 = time.perf_counter()
        if button is not None:
            button.disabled = True
        self.stage(first)
        try:
            yield self
            if self.state == "running":
                self.done()
        except Exception as exc:  # noqa: BLE001 - the line shows verl's (or labkit's) error text
            self.failed(exc)
        finally:
            if button is not None:
                button.disabled = False


@contextmanager
def live_stage(name: str) -> Iterator[None]:
    """A progress bar for one live call that reports no stages of its own (a gloo demo, a hang reproduction): the
    stage name while it runs, full when it returns."""
    try:
        from tqdm.auto import tqdm  # installed with transformers; never a dependency of its own
    except ImportError:  # pragma: no cover
        print(f"{name} …", flush=True)
        yield
        return
    bar = tqdm(total=1, desc=name, leave=True, bar_format="{desc}: {bar} {elapsed}")
    try:
        yield
        bar.update(1)
    finally:
        bar.close()
