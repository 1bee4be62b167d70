"""What every arithmetic panel is built from: number boxes without caps, the profile and loop toggles, and a figure
area that shows either the current figures or verl's verdict card, never the figures of an earlier setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import ipywidgets as W

from labkit.ui import widget_outputs as outputs

STYLE = {"description_width": "150px"}
LOOPS = ("v1", "v0")  # verl 0.9.1's trainer loops (engine profile only): trainer.use_v1=true / false


def int_box(label: str, value: int, tip: str = "") -> W.IntText:
    """A number box for a config size: any integer (a real config has thousands of prompts, hundreds of GPUs); a
    value verl or labkit rejects shows its verdict instead of the figures."""
    return W.IntText(
        value=int(value),
        description=label,
        tooltip=tip or None,
        continuous_update=False,
        style=STYLE,
        layout=W.Layout(width="260px"),
    )


def profile_toggle(profile: str) -> W.ToggleButtons:
    return W.ToggleButtons(
        options=["legacy", "engine"],
        value=profile,
        description="verl profile",
        tooltips=["verl <= 0.7 workers (fsdp_workers.py, dp_actor.py)", "verl 0.9.1 engine workers"],
        style={"description_width": "90px", "button_width": "80px"},
    )


def loop_toggle(loop: str, profile: str) -> W.ToggleButtons:
    """v1 (0.9.1's default PPOTrainer) or v0 (RayPPOTrainer); legacy has only RayPPOTrainer, so it is disabled."""
    return W.ToggleButtons(
        options=list(LOOPS),
        value=loop,
        description="trainer loop",
        disabled=profile == "legacy",
        tooltips=["trainer.use_v1=true (0.9.1 default)", "trainer.use_v1=false (RayPPOTrainer)"],
        style={"description_width": "90px", "button_width": "60px"},
    )


def loop_overrides(profile: str, loop: str) -> list[str]:
    """The override that picks the trainer loop (none for legacy, whose loop is RayPPOTrainer)."""
    return [] if profile == "legacy" else [f"trainer.use_v1={'true' if loop == 'v1' else 'false'}"]


def extra_box(value: str = "") -> W.Text:
    """Any further overrides, ``key=value`` separated by spaces (nodes, critic, SP, a budget ...)."""
    return W.Text(
        value=value,
        description="more overrides",
        placeholder="key=value key=value …",
        continuous_update=False,
        style=STYLE,
        layout=W.Layout(width="520px"),
    )


class FigureArea:
    """An Output that is replaced on every draw: the figures of this setting, or the verdict card that replaces them.
    Its content is set as the widget's state (``labkit.ui.widget_outputs``), never captured."""

    def __init__(self) -> None:
        self.out = W.Output()
        self.showing: str = "nothing"  # "figures", "verdict" or "nothing": what the last draw left (tests read it)
        self.last: list[Any] = []  # the figures of the last draw

    def figures(self, figs: Iterable[Any]) -> None:
        figs = list(figs)
        outputs.show(self.out, *(outputs.figure_output(fig) for fig in figs))
        self.showing, self.last = "figures", figs

    def clear(self) -> None:
        """No figures: the verdict card above the area says why (the config fails)."""
        outputs.show(self.out)
        self.showing, self.last = "nothing", []

    def verdict(self, card_html: str) -> None:
        outputs.show(self.out, outputs.html_output(card_html, "verl's verdict"))
        self.showing, self.last = "verdict", []


def column(widgets: Sequence[W.Widget]) -> W.VBox:
    return W.VBox(list(widgets))


def fitting_profiles(width: int, keep: str | None = None) -> list[str]:
    """The length profiles (data/length_profiles.json) a row of ``width`` tokens can hold: an explicit list only
    when its longest length fits (verl pads every row to the width, no sample is longer), a drawn or full-width
    profile always (it is clipped to the width). ``keep``: a profile that stays listed in any case (the one chosen
    now: it shows why it does not fit instead of vanishing)."""
    from labkit.config.lengths import profiles

    out = []
    for name, spec in profiles().items():
        if spec["kind"] != "explicit" or max(spec["lengths"]) <= width or name == keep:
            out.append(name)
    return out


def lengths_dropdown(value: str, width: int, description: str = "length profile") -> W.Dropdown:
    """A length-profile dropdown offering only the profiles that fit rows of ``width`` tokens (and ``value``)."""
    return W.Dropdown(options=fitting_profiles(width, value), value=value, description=description, style=STYLE)


def refit_lengths(dropdown: W.Dropdown, width: int, always: Sequence[str] = ()) -> None:
    """Offer the profiles that fit ``width`` now (``always`` first, the chosen one kept). ipywidgets selects the
    first option of a new list and fires the observers twice on the way back: while ``dropdown.refitting`` is True
    an observer must ignore the event (``refitting``)."""
    value = dropdown.value
    options = [*always, *(p for p in fitting_profiles(width, value) if p not in always)]
    if list(dropdown.options) == options:
        return
    dropdown.refitting = True
    try:
        dropdown.options = options
        dropdown.value = value
    finally:
        dropdown.refitting = False


def refitting(dropdown: W.Dropdown) -> bool:
    """Whether ``dropdown``'s value events come from ``refit_lengths`` (not from the user)."""
    return bool(getattr(dropdown, "refitting", False))


def row_width(cfg: Any) -> int:
    """The padded row width of a config, ``rollout.prompt_length + rollout.response_length`` (what a length must fit,
    the ``width`` of ``labkit.rules.geometry.BatchGeometry``), read without building the geometry (no error for odd sizes)."""
    g = cfg.get
    return int(g("actor_rollout_ref.rollout.prompt_length") or 0) + int(
        g("actor_rollout_ref.rollout.response_length") or 0
    )
