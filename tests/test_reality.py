"""The reality corpus and the agreement report: every case is well formed and cited, labkit answers each one as its
user would, the cases it gets right stay right (and the known disagreements stay listed with a cause), and the
README's totals are the ones the corpus gives today."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from labkit.memory.gpus import gpu_names
from labkit.reality.ask import launch_script
from labkit.reality.corpus import CORPUS_DIR, CorpusError, load_corpus, parse_case
from labkit.reality.report import known_disagreements, markdown_table
from labkit.reality.score import predicted_counter, score, totals

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scores():
    return [score(c) for c in load_corpus()]


def test_the_corpus_is_large_enough_and_every_case_opens_to_its_source():
    cases = load_corpus()
    assert len(cases) >= 80
    assert len({c.id for c in cases}) == len(cases)
    assert len({c.outcome for c in cases}) == 2  # both OOM reports and runs that ran
    for c in cases:
        assert re.match(r"https://(github\.com|verl\.readthedocs\.io)/", c.url), c.id
        if "github.com" in c.url and "/blob/" in c.url:  # a file is cited at a commit, never a moving branch
            assert re.search(r"/blob/[0-9a-f]{40}/", c.url), c.id
        assert c.gpu_preset is None or c.gpu_preset in gpu_names(), c.id
        assert c.summary and c.release_basis and c.confidence_why, c.id


def test_every_case_names_its_gpus_and_model_in_what_it_passes(tmp_path):
    """The run's own arguments (or an assumed value, with why) set the GPU count and the model: nothing is left to
    labkit's defaults."""
    for c in load_corpus():
        keys = {a.split("=", 1)[0].lstrip("+") for a in c.arguments}
        assert "actor_rollout_ref.model.path" in keys, c.id
        assert "trainer.n_gpus_per_node" in keys, c.id
        assert all(a.why for a in c.assumed), c.id


def test_known_disagreements_are_exactly_the_cases_labkit_gets_wrong(scores):
    known = known_disagreements()
    wrong = {s.case.id: s.agreement for s in scores if s.agreement != "agree"}
    assert set(wrong) - set(known) == set(), "new disagreements (a regression, or list them with a cause)"
    assert set(known) - set(wrong) == set(), "listed cases that now agree: take them off the list"
    for case_id, entry in known.items():
        assert entry["verdict"] == wrong[case_id], case_id
        assert len(entry["cause"].split()) >= 5, case_id


def test_no_case_is_refused(scores):
    """Every case is answered (a fork's key, a recipe's base YAML, an old release): never exit 2."""
    refused = [(s.case.id, s.answer.refusal) for s in scores if s.verdict == "refused"]
    assert refused == []


def test_the_readme_shows_todays_totals(scores):
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- section: reality -->")
    block = readme[start : readme.index("<!-- end section -->", start)]
    table = markdown_table(totals(scores), "DATE")
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    for row in rows:
        assert re.sub(r"measured \S+", "", row) in re.sub(r"measured \S+", "", block), row


def test_the_counter_of_a_log_holds_the_slept_pool_only_when_the_engine_shares_the_process():
    report = {
        "phases": {
            "generate": {"peak_bytes": 70, "terms": {"rollout_weights": 10, "kv_cache": 40, "params": 20}},
            "update_actor": {"peak_bytes": 60, "terms": {"params": 20, "activations": 35, "cuda_context": 5}},
        }
    }
    gib = 2**30
    with_pool = predicted_counter(report, "process_peak_with_pool") * gib
    without = predicted_counter(report, "process_peak") * gib
    assert with_pool == 50 + 55  # the slept pool stays counted beside the update's allocated peak
    assert without == 55  # the update's allocated bytes; the context is outside the allocator


def test_a_malformed_case_is_one_line_naming_its_field(tmp_path):
    good = yaml.safe_load((CORPUS_DIR / "verl-issue-1141.yaml").read_text())
    path = tmp_path / "verl-issue-1141.yaml"
    for mutate, field in (
        (lambda d: d["source"].pop("url"), "source.url"),
        (lambda d: d.update(outcome="maybe"), "outcome"),
        (lambda d: d["assumed"].append({"set": "trainer.nnodes=2"}), "why"),
        (lambda d: d["config"].append("not an override"), "config item"),
        (lambda d: d["release"].update(verl="latest"), "release.verl"),
    ):
        doc = yaml.safe_load(yaml.safe_dump(good))
        mutate(doc)
        with pytest.raises(CorpusError, match=re.escape(field)):
            parse_case(doc, path)


def test_the_launch_script_passes_each_argument_as_one_word():
    c = next(c for c in load_corpus() if any("[" in a and "'" in a for a in c.arguments))
    text = launch_script(c)
    assert text.startswith("python3 -m verl.trainer.main_ppo")
    assert text.count(" \\\n  ") == len(c.arguments)
