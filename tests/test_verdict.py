"""labkit.ui.verdict and labkit.ui.html_table: the card shows verl's own record, expect_verl_error asserts the code."""

from __future__ import annotations

import re

import pytest

from labkit.balance import balance_batch, micro_batches
from labkit.config.messages import ConfigError
from labkit.config.verl_config import SEED_EXAMPLE, load_config
from labkit.rules.catalogue import catalogue
from labkit.ui.html_table import html_table
from labkit.ui.verdict import expect_verl_error, verdict_html, verdict_of, verdict_text
from labkit.validate.report import VerlCheckError, check, raise_for

N13 = SEED_EXAMPLE + ["actor_rollout_ref.rollout.n=13"]


@pytest.fixture(scope="module")
def n13():
    return load_config(overrides=N13, profile="legacy")


def test_card_of_a_report_carries_the_first_error(n13):
    report = check(n13)
    first = report.first_error
    card = verdict_html(report)
    assert re.search(r"data-verl-code='E21'", card)
    assert first.message in verdict_text(report)  # verl's text, verbatim (no quote to escape in it)
    for line in first.arithmetic:
        assert line.replace("'", "&#x27;") in card
    assert first.fixes and all(f in card for f in first.fixes)
    ok = check(load_config(overrides=SEED_EXAMPLE, profile="legacy"))
    assert verdict_of(ok).ok and "data-verl-code='ok'" in verdict_html(ok)


def test_expect_verl_error_catches_raise_for_with_its_fixes(n13):
    with expect_verl_error("E21", show=False) as caught:
        raise_for(n13)
    assert isinstance(caught.error, VerlCheckError) and caught.finding.code == "E21"
    # raise_for skips the fix search; the card runs it for the config the error was raised on
    assert caught.verdict.fixes == check(n13).first_error.fixes != []


def test_expect_verl_error_fails_when_nothing_or_another_code_is_raised(n13):
    with pytest.raises(AssertionError, match="raised nothing"):
        with expect_verl_error("E21", show=False):
            pass
    with pytest.raises(AssertionError, match="expected E26, got E21"):
        with expect_verl_error("E26", show=False):
            raise_for(n13)
    with pytest.raises(NameError):  # a broken demonstration is not swallowed
        with expect_verl_error("E21", show=False):
            raise NameError("raise_for")
    with pytest.raises(ConfigError):  # nor is a config labkit cannot read
        with expect_verl_error(show=False):
            load_config(overrides=["data.train_batch_size=-1"])


def test_builtin_errors_with_verl_text_are_looked_up_in_the_catalogue():
    with expect_verl_error("E36", show=False) as e36:
        balance_batch.balance_batch([100, 200, 300], 4)
    assert e36.verdict.arithmetic == ["items = 3", "k = 4"] and e36.verdict.when == catalogue()["E36"].when
    light = [[3000] * 8, [500] * 2]
    with expect_verl_error("E32", fix="raise the budget", show=False) as e32:  # a bare assert: needs its code
        micro_batches.plan_dp_micro_batches(light, 4096, profile="legacy")
    assert e32.verdict.fixes == ["raise the budget"] and "raised on dp_rank 1" in e32.verdict.notes
    with pytest.raises(AssertionError, match="expected a verl error"):  # a message-less assert without a code
        with expect_verl_error(show=False):
            micro_batches.plan_dp_micro_batches(light, 4096, profile="legacy")
    with pytest.raises(AssertionError, match="expected E36"):  # right type, text of no catalogue entry
        with expect_verl_error("E36", show=False):
            raise AssertionError("something else")


def test_input_errors_get_a_grey_card():
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["data.train_batch_size=-1"])
    v = verdict_of(info.value)
    assert v.kind == "input" and v.code is None and "must be >= 1" in verdict_text(info.value)


def test_html_table_escapes_and_aligns():
    out = html_table([{"stage": "<b>", "rows": 720}, {"stage": "x", "share": 0.123456}], caption="a & b")
    assert "&lt;b&gt;" in out and "a &amp; b" in out and "0.1235" in out
    assert out.count("<th ") == 3  # stage, rows, share: every key, first-seen order
    assert "text-align:right'>720<" in out
    plain = html_table([[1, "a"], [2, "b"]])
    assert "<th " not in plain and plain.count("<tr>") == 2
