"""One colour per memory term (labkit.ui.term_colours): the same term has the same colour in every figure of the lab
(the dashboard, notebook 07's phase bars, the trace plot), no two terms of one figure share a colour or look alike,
names the term table does not hold get a colour too, and the largest blocks carry their term's name."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest
from _known_configs import GRPO_7B_8K

from labkit.memory.terms import TERMS
from labkit.ui import memory_figures
from labkit.ui.dashboard_figures import memory_figure
from labkit.ui.figure_style import validated
from labkit.ui.term_colours import LABEL_SHARE, delta_e, known_terms, lab_of, palette, term_colours

ARR = "actor_rollout_ref"
# notebook 07's config: 16 rows per log-prob micro-batch of 9,216-token rows, the eager entropy (15+ terms stacked)
USER = GRPO_7B_8K
ALIKE = 10.0  # CIE94: below this two colours read as the same colour


@pytest.fixture(scope="module")
def rep():
    return memory_figures.report_for(USER, "Qwen2.5-7B", "H100-80GB")


def _colours(fig) -> dict[str, str]:
    data = json.loads(fig.to_json())["data"] if hasattr(fig, "to_json") else fig["data"]
    return {
        t["name"]: t["marker"]["color"] for t in data if t.get("type") == "bar"
    }  # the terms (not the capacity line)


def _assert_distinct(colours: dict[str, str]) -> None:
    values = list(colours.values())
    assert len(set(values)) == len(values), [n for n in colours if values.count(colours[n]) > 1]
    for (a, ca), (b, cb) in itertools.combinations(colours.items(), 2):
        d = float(delta_e(lab_of(ca), lab_of(cb)))
        assert d >= ALIKE, f"{a} {ca} and {b} {cb} look alike (CIE94 {d:.1f})"


def test_every_known_term_owns_a_colour_unlike_every_other():
    known = known_terms()
    assert known == list(TERMS)
    colours = term_colours(known)
    _assert_distinct(colours)
    assert len(palette(64)) == 64 and len(set(palette(64))) == 64


def test_one_figure_never_repeats_a_colour(rep):
    """07's phase bars, the dashboard's, and a figure of every known term plus 30 names no table holds."""
    fig = memory_figures.phase_stack(rep)
    terms = {t for p in rep.phases.values() for t in p.terms}
    assert len(terms) >= 15 and set(_colours(fig)) == terms
    _assert_distinct(_colours(fig))
    _assert_distinct(_colours(memory_figure(rep)))
    rng = random.Random(0)
    new = [f"{rng.choice(['moe', 'vision', 'mcore', 'pp'])}_{i}_{rng.randrange(10**6)}" for i in range(30)]
    everything = term_colours([*known_terms(), *new])
    assert len(set(everything.values())) == len(everything)


def test_a_term_has_one_colour_in_every_figure(rep):
    """The same term in 07's bars, the dashboard's bars and the formula side of the trace plot: one colour; the
    trace's tensors take colours no term of that figure has."""
    stack, dash = _colours(memory_figures.phase_stack(rep)), _colours(memory_figure(rep))
    assert stack == dash
    phase = rep.phases["update_actor"]
    formula = dict(list(phase.terms.items())[:6])
    traced = {
        "phase": "update_actor",
        "formula": formula,
        "ratio": 1.0,
        "result": {
            "op": "mm",
            "module": "backward",
            "peak_bytes": sum(formula.values()),
            "alive": [
                {"op": op, "dtype": "torch.bfloat16", "shape": [4096, 152064], "bytes": 2**30 * (i + 1)}
                for i, op in enumerate(["mm", "log_softmax", "addmm", "mul", "exp", "sum", "gather", "sub", "add"])
            ],
        },
    }
    fig = memory_figures.trace_figure(traced)
    trace = _colours(fig)
    for term in formula:
        assert trace[f"formula: {term}"] == stack[term], term
    _assert_distinct(trace)
    assert json.loads(validated(fig).to_json()) == json.loads(fig.to_json())


def test_names_outside_the_table_are_stable_and_avoid_known_colours():
    """A name TERMS does not hold (another engine's term) gets the same colour whatever the figure's order, and one
    no known term has while spare colours remain."""
    new = ["moe_experts", "router_logits", "vision_tower", "fp32_main_grads", "pp_in_flight", "vocab_logits"]
    known = term_colours(known_terms())
    for perm in (new, new[::-1], sorted(new)):
        got = term_colours([*perm, "params", "entropy"])
        assert {n: got[n] for n in new} == {n: term_colours([*new, "params", "entropy"])[n] for n in new}
        assert got["params"] == known["params"] and got["entropy"] == known["entropy"]
        assert not set(got[n] for n in new) & set(known.values())
    # a name alone and a name among others keeps its colour when nothing else in the figure holds it
    alone = term_colours(["moe_experts"])["moe_experts"]
    assert term_colours(["moe_experts", "params"])["moe_experts"] == alone


def test_the_largest_blocks_carry_their_terms_name(rep):
    """07's old_log_prob bar reads "entropy" on its largest block; every block of at least LABEL_SHARE of the
    tallest bar is named, smaller ones are not (their name is in the legend and the hover)."""
    data = json.loads(memory_figures.phase_stack(rep).to_json())["data"]
    phases = list(rep.phases)
    tallest = max(p.peak_bytes for p in rep.phases.values())
    big = max(rep.phases["old_log_prob"].terms.items(), key=lambda kv: kv[1])[0]
    assert big == "entropy"
    for t in (t for t in data if t.get("type") == "bar"):
        for x, text in zip(phases, t["text"]):
            size = rep.phases[x].terms.get(t["name"], 0)
            assert text == (t["name"] if size >= LABEL_SHARE * tallest else ""), (t["name"], x, text)
    entropy = next(t for t in data if t["name"] == "entropy")
    assert entropy["text"][phases.index("old_log_prob")] == "entropy"
    assert data[0]["name"] == "entropy"  # the largest term sits at the bottom of the stack, first in the data


def test_palette_colours_stay_visible_on_white():
    lightness = np.array([lab_of(c)[0] for c in palette(64)])
    assert lightness.max() <= 86 and lightness.min() >= 34
