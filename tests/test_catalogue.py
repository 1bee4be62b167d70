"""The error catalogue: every code labkit shows has an entry, docs/errors.md is rendered from it, `labkit explain`,
and the templates are the texts labkit really prints."""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import string
import sys
from pathlib import Path

import pytest

from labkit.cli import main
from labkit.config.verl_config import SEED_EXAMPLE
from labkit.rules.catalogue import WHEN, catalogue, code_of, entry, message, render_markdown

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from golden_corpus import random_overrides  # noqa: E402

A, R, C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "critic"
CODE_IN_SOURCE = re.compile(r"""["']((?:E|X|B|S|N|F|M)\d+|GA|V1)["']""")
CODE_IN_CHECK = re.compile(r"\(((?:E|X|B|S|N|M)\d+|GA|V1|[^\s()]+)\): |note \(\w+\): (\S+)")


def cli(*argv: str) -> tuple[int, str, str]:
    """Run labkit in-process; (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _matches(code: str, text: str) -> bool:
    return code_of(text, (code,)) == code


def test_docs_errors_md_is_rendered_from_the_catalogue():
    docs = ROOT / "docs" / "errors.md"
    assert docs.is_file() and docs.read_text() == render_markdown(), (
        "docs/errors.md is stale: regenerate it with `python -m labkit.cli explain --markdown > docs/errors.md`"
    )


def test_entries_are_well_formed():
    text = render_markdown()
    for code, e in catalogue().items():
        assert e.title and e.where and e.versions and e.why, code
        assert e.when in WHEN, code
        assert (e.exc_type is None) == (e.when in ("silent", "notice", "info")), code
        assert f"\n### {code}\n" in text, code
        for t in e.templates:
            t.format(**{f: 0 for _, f, _, _ in string.Formatter().parse(t) if f})  # valid str.format syntax


def test_every_code_in_labkit_source_has_an_entry():
    found: dict[str, str] = {}
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        for code in CODE_IN_SOURCE.findall(path.read_text()):
            found.setdefault(code, str(path.relative_to(ROOT)))
    assert len(found) > 40  # the regex still finds the codes
    missing = {c: p for c, p in found.items() if c not in catalogue()}
    assert not missing, f"codes without an entry in data/error_catalogue.yaml (code: first file): {missing}"


def _corpus_codes() -> tuple[set[str], list[tuple[str, str, str]]]:
    """Codes `labkit check` and `labkit plan --json` show over 100 random configs x 2 profiles, plus
    (code, message, explanation) of every finding and stage error the plans carry."""
    rng = random.Random(7)
    codes: set[str] = set()
    texts: list[tuple[str, str, str]] = []
    for _ in range(100):
        overrides = random_overrides(rng)
        for profile in ("legacy", "engine"):
            _, out, _ = cli("plan", *overrides, "--profile", profile, "--json")
            s = json.loads(out)["summary"]
            for f in (
                (s.get("findings") or []) + [s.get("first_error") or {}] + list((s.get("stage_errors") or {}).values())
            ):
                if f:
                    codes.add(f["code"])
                    texts.append((f["code"], f.get("message") or "", f.get("explanation") or ""))
            _, out, _ = cli("check", *overrides, "--profile", profile)
            codes.update(a or b for a, b in CODE_IN_CHECK.findall(out))
    return codes, texts


@pytest.fixture(scope="module")
def corpus() -> tuple[set[str], list[tuple[str, str, str]]]:
    return _corpus_codes()


def test_every_code_labkit_shows_over_random_configs_has_an_entry(corpus):
    codes, _ = corpus
    assert {"E1", "E21", "E26", "E30", "S1", "N6", "X4"} <= codes  # the corpus reaches both profiles' rules
    missing = sorted(codes - set(catalogue()))
    assert not missing, f"labkit showed codes without a catalogue entry: {missing}"


def test_every_message_labkit_shows_matches_its_template(corpus):
    _, texts = corpus
    bad = []
    for code, msg, expl in texts:
        if code not in catalogue():
            continue  # reported by the test above
        ok = _matches(code, msg) if msg else ("" in entry(code).templates or _matches(code, expl))
        if not ok:
            bad.append((code, msg or expl))
    assert not bad, f"texts that match none of their code's templates: {sorted(set(bad))[:10]}"


# override sets (None = back to the default) that reach the rules the random corpus seldom reaches
TARGETED = [
    {f"{R}.log_prob_micro_batch_size_per_gpu": None},
    {f"{R}.log_prob_micro_batch_size": 48},
    {f"{A}.ppo_micro_batch_size_per_gpu": None},
    {f"{A}.ppo_micro_batch_size": 12},
    {f"{A}.ppo_micro_batch_size": 7, f"{A}.ppo_micro_batch_size_per_gpu": None},
    {f"{A}.loss_agg_mode": "token-sum"},
    {f"{A}.ulysses_sequence_parallel_size": 2, "actor_rollout_ref.model.use_remove_padding": "false"},
    {"algorithm.adv_estimator": "gae"},
    {
        "algorithm.adv_estimator": "gae",
        f"{C}.ppo_micro_batch_size": 7,
        f"{C}.ulysses_sequence_parallel_size": 2,
        f"{C}.model.use_remove_padding": "false",
        f"{C}.ppo_mini_batch_size": 64,
    },
    {f"{R}.val_kwargs.do_sample": "true", f"{R}.temperature": 0},
    {f"{R}.mode": "sync"},
    {"algorithm.use_kl_in_reward": "true", f"{A}.use_kl_loss": "true", "data.val_batch_size": 8},
    {"trainer.critic_warmup": 2},
    {"trainer.use_legacy_worker_impl": "disable"},
    {
        f"{A}.use_dynamic_bsz": "true",
        f"{R}.log_prob_use_dynamic_bsz": "false",
        f"{R}.log_prob_micro_batch_size_per_gpu": None,
    },
    {f"{R}.log_prob_micro_batch_size": 2, f"{R}.log_prob_micro_batch_size_per_gpu": None},
    {f"{A}.ulysses_sequence_parallel_size": 4, "trainer.n_gpus_per_node": 8},
    {f"{A}.use_dynamic_bsz": "true", f"{A}.ppo_max_token_len_per_gpu": 100},
]


def test_every_message_of_targeted_configs_matches_its_template():
    from labkit.config.messages import ConfigError
    from labkit.config.verl_config import load_config
    from labkit.validate.report import check

    seen, bad = set(), []
    for case in TARGETED:
        overrides = [o for o in SEED_EXAMPLE if o.split("=")[0] not in case]
        overrides += [f"{k}={v}" if v is not None else f"~{k}" for k, v in case.items()]
        for profile in ("legacy", "engine"):
            try:
                cfg = load_config(None, overrides, profile=profile)
            except ConfigError:  # a key of the other profile only
                continue
            for f in check(cfg, 14, 3, fixes=False).findings:  # 14 heads, 3 KV heads: E41 / E42 with sp 2 or 4
                seen.add(f.code)
                if f.code not in catalogue() or not (
                    _matches(f.code, f.message)
                    if f.message
                    else "" in entry(f.code).templates or _matches(f.code, f.explanation)
                ):
                    bad.append((f.code, f.message))
    assert {
        "B1",
        "B2",
        "B3",
        "E3",
        "E4",
        "E7",
        "E8",
        "E12",
        "E13",
        "E14",
        "E15",
        "E18",
        "E19",
        "E25",
        "E41",
        "E42",
        "N1",
        "N2",
        "N4",
        "N5",
        "X2",
        "X3",
    } <= seen, seen
    assert not bad, f"texts that match none of their code's templates (or have no entry): {bad[:10]}"


@pytest.mark.parametrize("code", ["E21", "e21", " E21 "])
def test_explain_prints_the_entry(code):
    rc, out, err = cli("explain", code)
    assert rc == 0 and not err
    e = entry("E21")
    for text in (e.template, e.exc_type, e.where, e.versions, e.when, e.why, "docs/errors.md#e21"):
        assert text in out, text


def test_explain_unknown_code_exits_2_with_the_known_codes():
    rc, out, err = cli("explain", "E99")
    assert rc == 2 and not out
    assert err.startswith("labkit: unknown code 'E99'; known: E1, ") and "GA" in err


def test_explain_markdown_and_listing():
    rc, out, _ = cli("explain", "--markdown")
    assert rc == 0 and out == render_markdown()
    rc, out, _ = cli("explain")
    assert rc == 0 and len(out.splitlines()) == len(catalogue())


def _set(base: list[str], **changes: object) -> list[str]:
    """``base`` overrides with keys replaced or added (``changes`` keys use __ for dots)."""
    out = {o.split("=", 1)[0]: o for o in base}
    for k, v in changes.items():
        key = k.replace("__", ".")
        out[key] = f"{key}={v}"
    return list(out.values())


def _key(path: str) -> str:
    return path.replace(".", "__")


# (profile, overrides, code, fields): configs whose first failure is formatted through message()
MESSAGE_CASES = [
    ("legacy", {_key(f"{R}.n"): 13}, "E21", dict(mini=130, micro=8)),
    ("legacy", {_key(f"{R}.n"): 1, _key(f"{A}.ppo_mini_batch_size"): 4}, "E20", dict(mini=0)),
    (
        "legacy",
        {
            _key(f"{R}.n"): 1,
            _key(f"{A}.ppo_micro_batch_size_per_gpu"): 2,
            "algorithm__adv_estimator": "gae",
            _key(f"{C}.ppo_mini_batch_size"): 4,
            _key(f"{C}.ppo_micro_batch_size_per_gpu"): 2,
        },
        "E22",
        dict(mini=0, micro=2),
    ),
    ("legacy", {_key(f"{R}.agent.num_workers"): 7}, "E26", dict(size=720, chunks=7)),
    ("engine", {_key(f"{A}.ppo_mini_batch_size"): 25, "trainer__use_v1": "false"}, "E29", dict(rows=120, mini=50)),
    ("engine", {_key(f"{R}.log_prob_micro_batch_size_per_gpu"): 7}, "E30", {}),
    (
        "legacy",
        {
            _key(f"{R}.log_prob_use_dynamic_bsz"): "true",
            _key(f"{R}.log_prob_max_token_len_per_gpu"): 100,
            _key(f"{R}.prompt_length"): 64,
            _key(f"{R}.response_length"): 128,
        },
        "E31",
        dict(budget=100, longest=192),
    ),
]


@pytest.mark.parametrize("profile,changes,code,fields", MESSAGE_CASES, ids=[c[2] for c in MESSAGE_CASES])
def test_message_is_the_text_labkit_check_prints(profile, changes, code, fields):
    expected = message(code, **fields)
    rc, out, _ = cli("check", *_set(SEED_EXAMPLE, **changes), "--profile", profile)
    assert rc == 1 and f"({code}): {expected}" in out, out


def test_message_is_the_text_labkit_plan_carries():
    """Stage errors of `plan --json`: E27 (engine dispatch), E28 (engine mini-batch), E31 (engine, longest row)."""
    cases = [
        (
            _set(
                SEED_EXAMPLE,
                **{
                    _key(f"{R}.n"): 1,
                    "data__gen_batch_size": 61,
                    "trainer__balance_batch": "false",
                    _key(f"{R}.agent.num_workers"): 1,
                    "trainer__use_v1": "false",
                },
            ),
            "E27",
            dict(size=61, chunks=6),
        ),
        (
            _set(
                SEED_EXAMPLE,
                **{
                    _key(f"{R}.n"): 1,
                    _key(f"{A}.ppo_mini_batch_size"): 25,
                    _key(f"{R}.log_prob_micro_batch_size_per_gpu"): 2,
                    _key(f"{R}.agent.num_workers"): 1,
                    "trainer__use_v1": "false",
                },
            ),
            "E28",
            dict(mini_batch_size=25, dp_size=6),
        ),
    ]
    for overrides, code, fields in cases:
        _, out, _ = cli("plan", *overrides, "--profile", "engine", "--json")
        errors = {e["code"]: e["message"] for e in (json.loads(out)["summary"].get("stage_errors") or {}).values()}
        assert errors.get(code) == message(code, **fields), (code, errors)
    dyn = _set(
        SEED_EXAMPLE,
        **{
            _key(f"{A}.use_dynamic_bsz"): "true",
            _key(f"{R}.log_prob_use_dynamic_bsz"): "true",
            _key(f"{R}.log_prob_max_token_len_per_gpu"): 64,
        },
    )
    _, out, _ = cli("plan", *dyn, "--profile", "engine", "--json", "--lengths", "full-width")
    s = json.loads(out)["summary"]
    width = s["width"]
    errors = {e["code"]: e["message"] for e in (s.get("stage_errors") or {}).values()}
    assert errors.get("E31") == message("E31", budget=64, longest=f"tensor({width})"), errors


def test_check_links_each_finding_to_its_docs_section():
    _, out, _ = cli("check", *_set(SEED_EXAMPLE, **{_key(f"{R}.n"): 13}), "--profile", "legacy")
    assert "  docs:  docs/errors.md#e21" in out
    _, out, _ = cli("check", *_set(SEED_EXAMPLE, **{_key(f"{A}.ppo_mini_batch_size"): 25}), "--profile", "engine")
    assert "  docs:  docs/errors.md#e30" in out and "  docs:  docs/errors.md#n6" in out  # a note gets its link too
