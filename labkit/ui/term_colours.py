"""One colour per memory term, the same in every figure of the lab (the dashboard, notebook 07's phase bars, the
formula side of the fake-CUDA trace plot), and no two terms of one figure alike.

A palette of 10 colours repeats after the tenth term: a 15-term bar then paints the ``entropy`` block of
old_log_prob the colour of ``rollout_weights``, and the reader blames the wrong term. Here the palette is as long as
the terms need (``palette``): starting from the lab's eight figure colours, each next colour is the candidate sRGB
colour farthest (CIE94 colour difference) from every colour taken so far, so the first twenty-odd are far apart and the
later ones still differ. Every name of ``labkit.memory.terms.TERMS`` owns one slot, in that table's order (a term
added there gets its own colour with no edit here); a name the table does not hold (a term a phase adds, the trace's
tensors) hashes (CRC-32, stable across runs) into the slots no known term owns, and moves on to the next free slot
when another name of the same figure holds that one (``term_colours``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from labkit.ui.figure_style import PALETTE

SPARE_SLOTS = 24  # colours beyond the known terms, for names the table does not hold
MIN_SLOTS = 64
_LIGHTNESS = (35.0, 85.0)  # CIELAB L* of a candidate: visible on white, dark enough under a white label


def _srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB in [0, 1] (n×3) to CIELAB (D65)."""
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = lin @ m.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


def _hex_to_rgb(colour: str) -> tuple[float, float, float]:
    return tuple(int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))


def lab_of(colour: str) -> np.ndarray:
    """The CIELAB coordinates of a ``#RRGGBB`` colour."""
    return _srgb_to_lab(np.array([_hex_to_rgb(colour)]))[0]


def delta_e(lab: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """CIE94 colour difference (graphic arts weights, the chroma of both colours averaged so it is symmetric): plain
    Lab distance overrates two saturated greens; around 10 two colours read as alike, above 15 as different."""
    dl = lab[..., 0] - ref[..., 0]
    c1, c2 = np.hypot(lab[..., 1], lab[..., 2]), np.hypot(ref[..., 1], ref[..., 2])
    dc = c1 - c2
    dh2 = np.maximum((lab[..., 1] - ref[..., 1]) ** 2 + (lab[..., 2] - ref[..., 2]) ** 2 - dc * dc, 0)
    c = np.sqrt(c1 * c2)
    return np.sqrt(dl * dl + (dc / (1 + 0.045 * c)) ** 2 + dh2 / (1 + 0.015 * c) ** 2)


@lru_cache(maxsize=4)
def palette(size: int = MIN_SLOTS) -> tuple[str, ...]:
    """``size`` colours, each as far as possible (``delta_e``) from all before it: greedy farthest point over a
    16-level sRGB grid, starting from the lab's figure palette."""
    levels = np.linspace(0, 1, 16)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)
    lab = _srgb_to_lab(grid)
    keep = (lab[:, 0] >= _LIGHTNESS[0]) & (lab[:, 0] <= _LIGHTNESS[1])
    grid, lab = grid[keep], lab[keep]
    chosen = list(PALETTE[:size])
    taken = _srgb_to_lab(np.array([_hex_to_rgb(c) for c in chosen]))
    nearest = np.min(delta_e(lab[:, None, :], taken[None, :, :]), axis=1)
    while len(chosen) < size:
        i = int(np.argmax(nearest))
        chosen.append("#" + "".join(f"{round(v * 255):02X}" for v in grid[i]))
        nearest = np.minimum(nearest, delta_e(lab, lab[i][None, :]))
    return tuple(chosen)


def known_terms() -> list[str]:
    """The names that own a slot: ``labkit.memory.terms.TERMS`` in its order."""
    from labkit.memory.terms import TERMS

    return list(TERMS)


def _slots() -> tuple[dict[str, int], tuple[str, ...]]:
    known = known_terms()
    return {t: i for i, t in enumerate(known)}, palette(max(MIN_SLOTS, len(known) + SPARE_SLOTS))


def term_colours(names: Iterable[str]) -> dict[str, str]:
    """The colour of each name of one figure: a known term's own colour; any other name a stable hash into the spare
    slots, moved to the next slot no other name of this figure holds. Deterministic for a set of names."""
    names = list(dict.fromkeys(names))
    owned, colours = _slots()
    out = {n: colours[owned[n]] for n in names if n in owned}
    used = set(out.values())
    spare = list(range(len(owned), len(colours))) or list(range(len(colours)))
    for name in sorted(n for n in names if n not in owned):
        start = zlib.crc32(name.encode()) % len(spare)
        order = [spare[(start + k) % len(spare)] for k in range(len(spare))]
        order += [i for i in range(len(colours)) if i not in spare]  # every spare taken here: any unused slot
        slot = next((i for i in order if colours[i] not in used), None)
        if slot is None:  # more names than colours: grow the palette for this figure
            colours = palette(len(colours) + len(names))
            slot = next(i for i in range(len(colours)) if colours[i] not in used)
        out[name] = colours[slot]
        used.add(colours[slot])
    return {n: out[n] for n in names}


def term_colour(name: str) -> str:
    """The colour of one term alone (a known term's colour is the same in every figure)."""
    return term_colours([name])[name]


LABEL_SHARE = 0.06  # a segment at least this share of the tallest bar carries its term's name


def term_bars(
    columns: dict[str, dict[str, float]],
    scale: float = 2**30,
    unit: str = "GiB",
    legend: dict[str, str] | None = None,
) -> list[dict]:
    """Stacked-bar traces (plotly dicts): one bar per column (``{x: {term: bytes}}``), one trace per term, the
    largest term at the bottom, each in its ``term_colours`` colour, its name written on every segment that is at
    least ``LABEL_SHARE`` of the tallest bar (plotly shrinks the text to fit inside). ``legend``: a legend name per
    term where it differs from the term."""
    xs = list(columns)
    tallest = max((sum(col.values()) for col in columns.values()), default=0) or 1
    size = {t: max(col.get(t, 0) for col in columns.values()) for col in columns.values() for t in col}
    terms = sorted(size, key=lambda t: -size[t])
    colours = term_colours(terms)
    legend = legend or {}
    return [
        {
            "type": "bar",
            "name": legend.get(t, t),
            "x": xs,
            "y": [columns[x].get(t, 0) / scale for x in xs],
            "marker": {"color": colours[t]},
            "text": [t if columns[x].get(t, 0) >= LABEL_SHARE * tallest else "" for x in xs],
            "textposition": "inside",
            "insidetextanchor": "end",
            "textangle": 0,
            "hovertemplate": f"{t}: %{{y:.2f}} {unit}<extra></extra>",
        }
        for t in terms
    ]
