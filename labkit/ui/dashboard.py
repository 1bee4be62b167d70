"""The start-here dashboard (notebooks/00_start_here.ipynb): paste a verl YAML or a command line of overrides, pick
the profile, the loop, the lengths, the model and the GPU, and see verl's verdict, the pipeline, per-rank bars,
memory per phase and the hang risks of that config.

An update (``Dashboard.update``, every widget's observer) parses the text and runs verl's checks at once
(``dashboard_state.quick``: milliseconds) and shows the verdict; the per-rank plan, which grows with B·n, runs on one
worker thread that always takes the latest input and drops older ones, and its figures replace a "planning…" line.
A state seen before is shown at once from the cache. Headless (``interactive=False``) everything is computed in the
call and shown as plain outputs. Widgets carry stable CSS classes (``CSS``) for a browser test.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from labkit.config.lengths import profile_names
from labkit.config.versions import RELEASES
from labkit.memory.gpus import gpu_names
from labkit.memory.model_catalogue import model_names
from labkit.ui import dashboard_state as S
from labkit.ui.dashboard_figures import METRICS, mime_bundle
from labkit.ui.dashboard_memory import memory_inputs, memory_knobs
from labkit.ui.dashboard_view import View, heading, render, show
from labkit.ui.latest_worker import LatestWorker

AUTO_TOKEN_SAMPLES = 65_536  # above this B·n the per-token plan (seconds) waits for the "plan tokens" button
RELEASE_CHOICES = tuple(reversed(RELEASES))
"""The releases the dashboard offers, newest first."""

CSS = {  # widget -> CSS class
    "root": "labkit-dashboard",
    "text": "labkit-config-text",
    "profile": "labkit-profile",
    "loop": "labkit-loop",
    "lengths": "labkit-lengths",
    "seed": "labkit-seed",
    "model": "labkit-model",
    "gpu": "labkit-gpu",
    "metric": "labkit-metric",
    "status": "labkit-dash-status",
    "verdict": "labkit-dash-verdict",
    "pipeline": "labkit-dash-pipeline",
    "ranks": "labkit-dash-ranks",
    "memory_plot": "labkit-dash-memory-plot",
    "memory": "labkit-dash-memory",
    "hangs": "labkit-dash-hangs",
    "tokens": "labkit-plan-tokens",
}


class Dashboard:
    """The widgets over ``dashboard_state``: ``update()`` re-reads every control; ``view`` / ``state`` are what is
    shown now. ``background=False`` computes the whole state inside ``update`` (headless runs, tests)."""

    def __init__(self, text: str, *, background: bool = True, **inputs: Any) -> None:
        """``inputs``: the controls' first values (``dashboard_state.Inputs`` fields: profile, loop, lengths, seed,
        model, gpu), their defaults otherwise."""
        import ipywidgets as W

        first = replace(S.Inputs(text), **inputs)
        self.background, self._worker, self._lock, self._gen = background, LatestWorker(), threading.Lock(), 0
        self._extra = first.extra  # a caller's overrides, kept before the memory inputs' own
        style, wide = {"description_width": "70px"}, W.Layout(width="300px")
        self.text = W.Textarea(value=text, layout=W.Layout(width="100%", height="300px"), continuous_update=True)
        self.profile = W.ToggleButtons(
            options=["engine", "legacy"], value=first.profile, description="profile", style=style
        )
        self.loop = W.ToggleButtons(options=["v1", "v0"], value=first.loop, description="loop", style=style)
        self.lengths = W.Dropdown(
            options=[S.NO_LENGTHS, *profile_names()],
            value=first.lengths,
            description="lengths",
            style=style,
            layout=wide,
        )
        self.seed = W.BoundedIntText(value=first.seed, min=0, max=10**6, description="seed", style=style, layout=wide)
        self.model = W.Dropdown(
            options=[S.AUTO_MODEL, *model_names()], value=first.model, description="model", style=style, layout=wide
        )
        self.gpu = W.Dropdown(options=gpu_names(), value=first.gpu, description="GPU", style=style, layout=wide)
        self.verl = W.Dropdown(
            options=[("(profile)", ""), *((f"verl {v}", v) for v in RELEASE_CHOICES)],
            value=first.verl,
            description="release",
            style=style,
            layout=wide,
        )
        self.sets = W.Textarea(
            value="\n".join(first.sets),
            placeholder="NAME=VALUE per line: shell values the script reads from its caller (e.g. DEVICE=gpu)",
            description="shell",
            style=style,
            layout=W.Layout(width="300px", height="60px"),
        )
        self.lora, self.cpu_optimizer = memory_inputs(style, wide)
        self.metric = W.Dropdown(
            options=[(v, k) for k, v in METRICS.items()],
            value="tokens",
            description="bars",
            style=style,
            layout=W.Layout(width="420px"),
        )
        self.tokens = W.Button(description="plan the tokens too", layout=W.Layout(display="none", width="220px"))
        self.status, self.verdict, self.pipeline, self.memory, self.hangs = (W.HTML() for _ in range(5))
        self.ranks, self.memory_plot = W.Output(), W.Output()
        controls = [self.verl, self.profile, self.loop, self.lengths, self.seed, self.model, self.gpu, self.sets]
        controls += [self.lora, self.cpu_optimizer]
        for c in (*controls, self.text):
            c.observe(self.update, names="value")
        self.metric.observe(self._redraw, names="value")
        self.tokens.on_click(self._plan_tokens)
        head = {k: W.HTML(heading(k)) for k in ("verdict", "pipeline", "ranks", "memory", "hangs")}
        self.widget = W.VBox(
            [
                W.HBox([W.Box([self.text], layout=W.Layout(flex="1 1 60%")), W.VBox(controls)]),
                self.status,
                head["verdict"],
                self.verdict,
                head["pipeline"],
                self.pipeline,
                head["ranks"],
                W.HBox([self.metric, self.tokens]),
                self.ranks,
                head["memory"],
                self.memory_plot,
                self.memory,
                head["hangs"],
                self.hangs,
            ]
        )
        for name, cls in CSS.items():
            (self.widget if name == "root" else getattr(self, name)).add_class(cls)
        self.state: S.State | None = None
        self.view: View | None = None
        background, self.background = self.background, False
        self.update()  # the first view is whole when the cell ends: a notebook's next cell may assert on it
        self.background = background

    # -- reading the controls ------------------------------------------------------------------------------------
    def inputs(self) -> S.Inputs:
        return S.Inputs(
            self.text.value,
            self.profile.value,
            self.loop.value,
            self.lengths.value,
            int(self.seed.value),
            self.model.value,
            self.gpu.value,
            extra=(*self._extra, *memory_knobs(int(self.lora.value), float(self.cpu_optimizer.value))),
            verl=self.verl.value,
            sets=tuple(line for line in self.sets.value.splitlines() if line.strip()),
        )

    def update(self, _: Any = None) -> None:
        """Show the input's verdict now, and its plan as soon as it is ready (the observer of every control)."""
        if getattr(self.lengths, "refitting", False):  # the length options follow the text: not a user's choice
            return
        inputs = self.inputs()
        self.loop.disabled = inputs.profile != "engine" or bool(inputs.verl)  # a release runs its own loop
        self.profile.disabled = bool(inputs.verl)
        with self._lock:
            self._gen += 1
            gen = self._gen
        st = S.cached(inputs)
        if st is not None or not self.background:
            st = st or S.evaluate(inputs)
            self._refit(st)
            self._show(gen, st)
            self._follow(gen, st)
            return
        first = S.quick(inputs)
        self._refit(first)
        self._show(gen, first, pending=not S.final(first))
        if not S.final(first):
            self._worker.submit(lambda: self._compute(gen, inputs))

    def _refit(self, st: S.State) -> None:
        """Offer the length profiles this config's rows can hold (an explicit list wider than the rows is no choice
        but an error); the chosen one stays, and no observer fires."""
        from labkit.ui.panel_parts import refit_lengths, row_width

        if st.cfg is not None:
            refit_lengths(self.lengths, row_width(st.cfg), always=[S.NO_LENGTHS])

    def _compute(self, gen: int, inputs: S.Inputs) -> None:
        if gen == self._gen:
            st = S.evaluate(inputs)
            self._show(gen, st)
            self._follow(gen, st)

    def _follow(self, gen: int, st: S.State) -> None:
        """After a rows-only state of a large step, the per-token one (automatic up to AUTO_TOKEN_SAMPLES)."""
        if not (st.tokens_deferred and st.samples <= AUTO_TOKEN_SAMPLES):
            return
        if self.background:
            self._worker.submit(lambda: self._tokens(gen, st.inputs))
        else:
            self._tokens(gen, st.inputs)

    def _tokens(self, gen: int, inputs: S.Inputs) -> None:
        if gen == self._gen:
            self._show(gen, S.evaluate(inputs, tokens=True))

    def _plan_tokens(self, _: Any = None) -> None:
        if self.state is not None:
            gen, inputs = self._gen, self.state.inputs
            self.tokens.description = "planning the tokens…"
            self._worker.submit(lambda: self._tokens(gen, inputs))

    # -- showing ---------------------------------------------------------------------------------------------------
    def _show(self, gen: int, st: S.State, pending: bool = False) -> None:
        """Put one state on screen, unless a newer input has been shown meanwhile."""
        with self._lock:
            if gen != self._gen:
                return
            self.state, self.view = st, render(st, self.metric.value, pending)
            v = self.view
            self.status.value, self.verdict.value, self.pipeline.value = v.status, v.verdict, v.pipeline
            self.memory.value, self.hangs.value = v.memory_text, v.hangs
            self.ranks.outputs = (mime_bundle(v.ranks),) if v.ranks else ()
            self.metric.layout.display = None if v.ranks else "none"  # no per-rank bars: no bar picker left empty
            self.memory_plot.outputs = (mime_bundle(v.memory),) if v.memory else ()
            auto = st.samples <= AUTO_TOKEN_SAMPLES and self.background
            self.tokens.layout.display = None if v.tokens_deferred and not auto else "none"
            self.tokens.description = f"plan the tokens of {st.samples:,} samples (seconds)"

    def _redraw(self, _: Any = None) -> None:
        if self.state is not None:
            self._show(self._gen, self.state, self.view.pending if self.view else False)

    def wait(self, timeout: float = 120.0) -> bool:
        """Block until the worker has shown the latest input (True) or ``timeout`` seconds passed (False)."""
        return self._worker.wait(timeout)

    def set(self, **values: Any) -> Dashboard:
        """Set controls by name (``text=``, ``profile=``, ``loop=``, ``lengths=``, ``model=``, ``gpu=``, ``seed=``,
        ``lora=``, ``cpu_optimizer=``, ``metric=``), each firing its observer as a user's edit does; returns self."""
        for name, value in values.items():
            getattr(self, name).value = value
        return self


@dataclass
class Shown:
    """What a headless ``dashboard`` call showed: the same ``state`` and ``view`` a ``Dashboard`` holds."""

    state: S.State
    view: View


def dashboard(text: str, interactive: bool = True, **inputs: Any) -> Dashboard | Shown:
    """The dashboard for ``text`` (``inputs``: ``dashboard_state.Inputs`` fields such as profile, loop, lengths,
    model, gpu): displayed widgets in a live kernel (``interactive``), else that config's view shown as plain outputs.
    Both results have ``.state`` and ``.view`` (the first view is complete either way)."""
    if interactive:
        from IPython.display import display

        d = Dashboard(text, **inputs)
        display(d.widget)
        return d
    st = state_of(text, **inputs)
    shown = Shown(st, render(st))
    show(shown.view)
    return shown


def state_of(text: str, **inputs: Any) -> S.State:
    """The evaluated state of a config text (keyword ``Inputs`` fields), per token: what a notebook asserts on."""
    return S.evaluate(replace(S.Inputs(text), **inputs), tokens=True)
