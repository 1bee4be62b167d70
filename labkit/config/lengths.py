"""Sequence lengths for the planner: explicit lists, or reproducible draws from named profiles.

A length is one sample's valid tokens (prompt + response), i.e. the row sum of ``attention_mask`` that verl's
``RayPPOTrainer._balance_batch`` and ``verl/utils/seqlen_balancing.py: rearrange_micro_batches`` read. Lengths are
bounded by the rollout width ``rollout.prompt_length + rollout.response_length`` (verl pads every row to it).
Profiles live in ``data/length_profiles.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from labkit.config.messages import InputError

PROFILES_FILE = Path(__file__).resolve().parents[2] / "data" / "length_profiles.json"


class LengthsError(InputError):
    """Lengths labkit cannot use: unknown profile, wrong count, a length outside [1, rollout width]."""


@lru_cache(maxsize=1)
def _load() -> dict[str, dict[str, Any]]:
    return json.loads(PROFILES_FILE.read_text())["profiles"]


def profiles() -> dict[str, dict[str, Any]]:
    """Every named profile (name -> its JSON spec, with a ``doc`` line)."""
    return {k: dict(v) for k, v in _load().items()}


def profile_names() -> list[str]:
    return list(_load())


@dataclass(frozen=True)
class Uniform:
    """Every sample ``prompt`` + ``response`` tokens long: the lengths a run is expected to see, as a log's
    ``prompt_length/mean`` and ``response_length/mean`` give them (``--lengths prompt=P,response=R``)."""

    prompt: int
    response: int
    source: str = "given"
    """Where they come from (``given``; a log's step, ``labkit.diagnose.log_lengths``)."""

    @property
    def tokens(self) -> int:
        return self.prompt + self.response

    def __str__(self) -> str:
        return f"prompt={self.prompt},response={self.response}"

    def describe(self) -> str:
        return f"every sample at {self.prompt:,} prompt + {self.response:,} response tokens"


_UNIFORM = re.compile(r"^prompt=(\d{1,9}),\s*response=(\d{1,9})$")

MAX_LENGTHS = 1_000_000
"""The most explicit lengths labkit takes (one per sample of a step)."""


def parse_lengths(text: str | list[int] | Uniform) -> list[int] | str | Uniform:
    """CLI form, validated once where it is read: ``"800,6500,1200"`` -> positive ints; ``prompt=P,response=R``
    -> ``Uniform`` (a log's mean lengths); else a known profile name. LengthsError for anything else (a list is
    returned as it is: already read)."""
    if isinstance(text, (list, Uniform)):
        return text
    text = text.strip()
    m = _UNIFORM.match(text.replace(" ", ""))
    if m:
        if int(m.group(2)) < 1 or int(m.group(1)) < 1:
            raise LengthsError(f"--lengths {text!r}: a prompt and a response of at least 1 token each.")
        return Uniform(int(m.group(1)), int(m.group(2)))
    if not text:
        raise LengthsError(f"--lengths is empty; use a profile ({', '.join(_load())}) or L1,L2,...")
    if text[0].isdigit() and (text.replace(",", "").replace(" ", "").isdigit()):
        parts = [x.strip() for x in text.split(",") if x.strip()]
        if len(parts) > MAX_LENGTHS:
            raise LengthsError(f"--lengths: {len(parts):,} lengths; labkit takes at most {MAX_LENGTHS:,}.")
        out = [int(x) if len(x) <= 12 else 10**12 for x in parts]
        if not out or min(out) < 1:
            raise LengthsError(f"--lengths {text!r}: each length must be a positive integer.")
        return out
    if text not in _load():
        raise LengthsError(
            f"--lengths: unknown length profile {text!r}; known profiles: {', '.join(_load())} (or comma-separated "
            "positive integers, or prompt=P,response=R: every sample at a log's mean lengths)."
        )
    return text


def _draw(spec: dict, size: int, cap: int, rng: np.random.Generator) -> np.ndarray:
    if spec["dist"] != "lognormal":
        raise LengthsError(f"unknown distribution {spec['dist']!r} in {PROFILES_FILE.name}")
    x = rng.lognormal(mean=np.log(spec["median"]), sigma=spec["sigma"], size=size)
    lo = min(int(spec.get("min", 1)), cap)
    return np.clip(np.rint(x), lo, cap).astype(np.int64)


def draw(name: str, n_prompts: int, n: int, prompt_length: int, response_length: int, seed: int = 0) -> list[int]:
    """B·n lengths from profile ``name``, in repeat(interleave=True) order (the n samples of a prompt adjacent)."""
    table = _load()
    if name not in table:
        raise LengthsError(f"unknown length profile {name!r}; known profiles: {', '.join(table)}.")
    spec, total, width = table[name], n_prompts * n, prompt_length + response_length
    if spec["kind"] == "explicit":
        base = list(spec["lengths"])
        out = [base[i % len(base)] for i in range(total)]
        return check_lengths(out, total, width, origin=f"profile {name!r}")
    if spec["kind"] == "full":
        return [width] * total
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise LengthsError(f"the seed of a drawn length profile must be a non-negative integer, got {seed!r}.")
    rng = np.random.default_rng(seed)
    prompts = _draw(spec["prompt"], n_prompts, prompt_length, rng)
    responses = _draw(spec["response"], total, response_length, rng)
    return (np.repeat(prompts, n) + responses).tolist()


def check_lengths(lengths: Sequence[int], count: int, width: int, origin: str = "lengths") -> list[int]:
    """Validate an explicit list: exactly ``count`` ints, each in [1, width]; returns a plain list."""
    out = [int(x) for x in lengths]
    if len(out) != count:
        raise LengthsError(
            f"{origin}: got {len(out)} lengths for B·n = {count} samples; give {count} values or a named profile "
            f"({', '.join(profile_names())})."
        )
    bad = [x for x in out if x < 1 or x > width]
    if bad:
        raise LengthsError(
            f"{origin}: length {bad[0]} is outside [1, {width}] = "
            "[1, rollout.prompt_length + rollout.response_length]; "
            "verl pads every row to that width, so no sample can be longer. Raise data.max_prompt_length / "
            "data.max_response_length or shorten the lengths."
        )
    return out


def check_uniform(spec: Uniform, prompt_length: int, response_length: int) -> Uniform:
    """LengthsError when ``spec`` is wider than the rows verl pads to (a prompt over data.max_prompt_length, a
    response over data.max_response_length)."""
    for what, value, limit, key in (
        ("prompt", spec.prompt, prompt_length, "data.max_prompt_length"),
        ("response", spec.response, response_length, "data.max_response_length"),
    ):
        if value > limit:
            raise LengthsError(
                f"--lengths {spec}: a {what} of {value:,} tokens is longer than {key} = {limit:,}; verl cuts or "
                "refuses longer ones, so no sample holds it"
            )
    return spec


def resolve_lengths(
    spec: Sequence[int] | str | Uniform | None,
    *,
    n_prompts: int,
    n: int,
    prompt_length: int,
    response_length: int,
    seed: int = 0,
) -> list[int] | None:
    """None stays None; a profile name is drawn; a list is checked against B·n and the rollout width."""
    if spec is None:
        return None
    if isinstance(spec, str):
        spec = parse_lengths(spec)
        if isinstance(spec, str):
            return draw(spec, n_prompts, n, prompt_length, response_length, seed)
    if isinstance(spec, Uniform):
        return [check_uniform(spec, prompt_length, response_length).tokens] * (n_prompts * n)
    return check_lengths(spec, n_prompts * n, prompt_length + response_length)
