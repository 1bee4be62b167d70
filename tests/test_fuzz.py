"""Random override sets, half of them with hostile values, through `labkit check` and `labkit plan` in-process: every
one gets an answer (exit 0, 1 or 2 with a one-line message), never an internal error, and in bounded time."""

from __future__ import annotations

import contextlib
import io
import os
import random
import sys
import time
from pathlib import Path

from labkit.cli import main
from labkit.config.keys import KEYS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from golden_corpus import random_overrides  # noqa: E402

HOSTILE = [
    "0",
    "-1",
    "1",
    "3",
    "7",
    "1000000",
    "2147483648",
    "null",
    "true",
    "abc",
    ".nan",
    "-.inf",
    "1e-3",
    "[1, 2]",
    "{a: 1}",
    "''",
    "1.5",
    "${oc.select:foo.bar, [}",
    "&a [*a]",
]
CONFIGS = int(os.environ.get("LABKIT_FUZZ_CONFIGS", "400"))  # a quick size in the suite; larger by hand
SEED, BOUND_S = 20261201, 15.0


def answer(argv: list[str]) -> tuple[int, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue(), time.perf_counter() - start


def test_random_hostile_configs_always_get_an_answer():
    rng, keys = random.Random(SEED), sorted(KEYS)
    problems, codes = [], set()
    for _ in range(CONFIGS):
        overrides = random_overrides(rng)
        if rng.random() < 0.5:
            overrides += [f"{rng.choice(keys)}={rng.choice(HOSTILE)}" for _ in range(rng.randint(1, 3))]
        for cmd in ("check", "plan", "memory"):
            argv = [cmd, *overrides, "--profile", rng.choice(["legacy", "engine"])]
            code, err, took = answer(argv)
            codes.add(code)
            if code not in (0, 1, 2) or took > BOUND_S or (code == 2 and err.count("\n") != 1):
                problems.append((code, round(took, 1), err.strip()[:200], argv))
    assert not problems, "\n".join(map(str, problems[:10]))
    assert {0, 1, 2} <= codes  # the fuzzer reaches accepted, rejected and unreadable configs


def test_every_entry_fuzzed_answers_on_one_line_in_bounded_time():
    """scripts/fuzz_inputs.py over every entry a user reaches (overrides, YAML files, each option, launch scripts,
    logs, the dashboard's text box): exit 0/1/2, one line for 2, JSON without NaN, no exception. The nightly size
    (10,000 cases) holds each answer to 2 s on quiet cores; beside a second test process the bound is wider."""
    from fuzz_inputs import problems

    found, ran = problems(int(os.environ.get("LABKIT_FUZZ_CASES", "400")), SEED, bound_s=BOUND_S)
    assert len(ran) == 6 and min(ran.values()) > 20, ran
    assert not found, "\n".join(map(str, found[:10]))
