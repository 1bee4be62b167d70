"""Fuzz every entry a user reaches: overrides, a YAML file, ``--lengths``, ``--model``, ``--gpu``, ``--gpu-memory``,
``--margin``, ``--seed``, ``--head``, a launch script, a log (``labkit diagnose``) and the dashboard's text box.

Each case runs in process (``labkit.cli.main``, or the dashboard's ``state_of``) and must answer with exit 0, 1 or 2
(2 with one line on stderr), within ``BOUND_S``, with JSON (``--json``) free of NaN and infinities; the dashboard
must fill a state or an error, never raise. Cases come from a fixed seed.

    .venv/bin/python scripts/fuzz_inputs.py --cases 10000      # the nightly size
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_corpus import random_overrides  # noqa: E402

from labkit.cli import main  # noqa: E402
from labkit.config.keys import KEYS  # noqa: E402

BOUND_S = 2.0
NOTICE_LINE = re.compile(r"^labkit: (note: |.*: read \d+ verl override)")
"""stderr lines that report what was read (a script's overrides, an override verl's Hydra refuses), not an error."""
ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "data" / "logs"
HOSTILE = [
    "0",
    "-1",
    "1",
    "3",
    "7",
    "1000000",
    "2147483648",
    "9223372036854775808",
    "9" * 5000,
    "null",
    "true",
    "abc",
    ".nan",
    "-.inf",
    "1e-3",
    "1e400",
    "[1, 2]",
    "{a: 1}",
    "''",
    "1.5",
    "${oc.select:foo.bar, [}",
    "&a [*a]",
    "!!int abc",
    "!!python/object:os.system ls",
    "\x00",
    "é" * 50,
    "x" * 20000,
]
TEXTS = [
    "",
    " ",
    "nope",
    "abc",
    "nan",
    "-5",
    "1e9",
    "0",
    "1,2,0",
    "800,6500",
    "1," * 3000 + "1",
    "x" * 15000,
    "gsm8k-like",
    "long-reasoning",
    "full-width",
    "seed-8",
    "\x00",
    "é",
    "1.5",
    "--",
    "-1GiB",
    "0.5",
    "80GiB",
    "1" + "0" * 400,
    "141GB",
    "inf",
    "-0",
    "H100-80GB",
    "Qwen2.5-7B",
    "tiny-qwen2",
    "",
    "flash_attn",
    "torch",
]
OPTIONS = {
    "--lengths": ("check", "plan", "memory"),
    "--seed": ("check", "plan"),
    "--model": ("memory",),
    "--gpu": ("memory",),
    "--gpu-memory": ("memory",),
    "--margin": ("memory",),
    "--head": ("memory",),
}


def _strict(text: str) -> None:
    def refuse(name: str) -> None:
        raise ValueError(f"JSON holds {name}")

    json.loads(text, parse_constant=refuse)


def run(argv: list[str], stdin: str | None = None) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    old = sys.stdin
    try:
        if stdin is not None:
            sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8", "surrogatepass")), encoding="utf-8")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's own errors
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdin = old
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


def _yaml(rng: random.Random, overrides: list[str]) -> str:
    """A YAML document from overrides, sometimes broken: hostile values, tags, anchors, deep nesting, tabs."""
    lines = []
    for item in overrides:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        lines.append("".join(f"{p}:\n{'  ' * (i + 1)}" for i, p in enumerate(parents)) + f"{leaf}: {value}")
    text = "\n".join(lines) + "\n"
    roll = rng.random()
    if roll < 0.2:
        text += f"data:\n  train_batch_size: {rng.choice(HOSTILE)}\n"
    elif roll < 0.3:
        text = "a: " + "[" * rng.randint(50, 500) + "]" * rng.randint(0, 500)
    elif roll < 0.4:
        text = "\t" + text
    elif roll < 0.5:
        text = text[: rng.randint(0, len(text))]
    return text


def _script(rng: random.Random, overrides: list[str]) -> str:
    body = " \\\n    ".join(overrides)
    roll = rng.random()
    head = "python3 -m verl.trainer.main_ppo"
    if roll < 0.2:
        return f"set -x\nMODEL=${{MODEL:-x}}\n{head} \\\n    {body} $@\n"
    if roll < 0.3:
        return f"for i in 1 2; do\n  {head} data.train_batch_size=$((i*{rng.choice(['8', '0', '2**62', 'x'])}))\ndone\n"
    if roll < 0.4:
        return f'{head} {rng.choice(HOSTILE)} $(cat foo) `ls` "${{A[@]}}"\n'
    if roll < 0.5:
        return "(" * rng.randint(1, 300) + head
    return f"{head} \\\n    {body}\n"


def _log(rng: random.Random) -> str:
    logs = sorted(LOGS.glob("*.log"))
    text = rng.choice(logs).read_text()
    roll = rng.random()
    if roll < 0.2:
        return text[: rng.randint(0, len(text))]
    if roll < 0.3:
        return "".join(rng.choice(text) for _ in range(rng.randint(0, 3000)))
    if roll < 0.4:
        return text.replace("GiB", rng.choice(["TiB", "", "GiB GiB", "9" * 400]))
    if roll < 0.5:
        return "\n".join(rng.sample(text.splitlines(), k=len(text.splitlines())))
    return text


def megatron_overrides(rng: random.Random) -> list[str]:
    """The Megatron engine with random sizes (some that do not divide the GPUs, the heads or the layers)."""
    m = "actor_rollout_ref.actor.megatron"
    out = [rng.choice(["model_engine=megatron", "actor_rollout_ref.actor.strategy=megatron"])]
    for key in ("tensor_model", "pipeline_model", "context", "expert_model"):
        out.append(f"{m}.{key}_parallel_size={rng.choice([1, 1, 2, 3, 4, 8])}")
    if rng.random() < 0.3:
        out.append(f"{m}.virtual_pipeline_model_parallel_size={rng.choice([1, 2, 3, 'null'])}")
    if rng.random() < 0.3:
        grain = rng.choice(["full", "selective", "null", "bogus"])
        out.append(f"{m}.override_transformer_config.recompute_granularity={grain}")
    if rng.random() < 0.2:
        out.append(f"actor_rollout_ref.model.path={rng.choice(['Qwen/Qwen3-8B', 'Qwen/Qwen3-30B-A3B', 'nope/x'])}")
    return out


def cases(count: int, seed: int, folder: Path) -> list[tuple[str, list[str], str | None]]:
    """(entry, argv, stdin) for ``count`` cases drawn from ``seed``; files are written under ``folder``."""
    rng, keys = random.Random(seed), sorted(KEYS)
    out = []
    for k in range(count):
        overrides = random_overrides(rng)
        if rng.random() < 0.3:
            overrides += megatron_overrides(rng)
        if rng.random() < 0.5:
            overrides += [f"{rng.choice(keys)}={rng.choice(HOSTILE)}" for _ in range(rng.randint(1, 3))]
        profile = ["--profile", rng.choice(["legacy", "engine"])]
        entry = rng.choice(["overrides", "yaml", "option", "script", "log", "dashboard"])
        if entry == "overrides":
            out.append((entry, [rng.choice(["check", "plan", "memory"]), *overrides, *profile, "--json"] * 1, None))
        elif entry == "yaml":
            path = folder / f"case{k}.yaml"
            path.write_text(_yaml(rng, overrides), encoding="utf-8", errors="surrogatepass")
            out.append((entry, [rng.choice(["check", "plan", "memory"]), str(path), *profile], None))
        elif entry == "option":
            option = rng.choice(sorted(OPTIONS))
            cmd = rng.choice(OPTIONS[option])
            out.append((entry, [cmd, *overrides, *profile, f"{option}={rng.choice(TEXTS)}"], None))
        elif entry == "script":
            out.append((entry, [rng.choice(["read", "check", "memory"]), "-", *profile], _script(rng, overrides)))
        elif entry == "log":
            out.append((entry, ["diagnose", "-", *rng.choice([[], ["--json"]])], _log(rng)))
        else:
            out.append((entry, [_script(rng, overrides) if rng.random() < 0.5 else _yaml(rng, overrides)], None))
    return out


def _dashboard(text: str) -> tuple[int, str, str, float]:
    from labkit.ui.dashboard import state_of

    start = time.perf_counter()
    st = state_of(text)
    took = time.perf_counter() - start
    error = str(st.error or "").strip()
    return (2 if error else 0), "", error + ("\n" if error else ""), took


def problems(count: int, seed: int, bound_s: float = BOUND_S) -> tuple[list[tuple], dict[str, int]]:
    """The cases that break a rule, and how many cases each entry ran."""
    found, ran = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for entry, argv, stdin in cases(count, seed, Path(tmp)):
            ran[entry] = ran.get(entry, 0) + 1
            try:
                code, out, err, took = _dashboard(argv[0]) if entry == "dashboard" else run(argv, stdin)
            except Exception as exc:  # noqa: BLE001 - the harness reports every escape
                found.append((entry, "raised", f"{type(exc).__name__}: {str(exc)[:200]}", [a[:80] for a in argv[:6]]))
                continue
            why = []
            if code not in (0, 1, 2):
                why.append(f"exit {code}")
            errors = [ln for ln in err.splitlines() if not NOTICE_LINE.match(ln)]  # what was read is a notice
            if code == 2 and len(errors) != 1:
                why.append(f"{len(errors)} error lines on stderr")
            if took > bound_s:
                why.append(f"{took:.1f} s")
            if "--json" in argv and code in (0, 1):
                try:
                    _strict(out.strip().splitlines()[-1] if out.strip() else "{}")
                except ValueError as exc:
                    why.append(str(exc)[:100])
            if why:
                found.append((entry, "; ".join(why), err.strip()[:200], [a[:80] for a in argv[:8]]))
    return found, ran


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=20261203)
    ns = ap.parse_args()
    t0 = time.perf_counter()
    found, ran = problems(ns.cases, ns.seed)
    print(f"{ns.cases} cases in {time.perf_counter() - t0:.0f} s: {ran}; {len(found)} problem(s)")
    for item in found[:50]:
        print(item)
    sys.exit(1 if found else 0)
