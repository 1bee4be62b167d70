"""The verdict with lengths in it (labkit.memory.verdict, break_even; --lengths prompt=P,response=R | log:PATH):
three states, the break-even as the exact boundary of "fits unless", the lengths a log's metrics give, padded rows
said to be full width whatever the data, and bad lengths refused in one line."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from _known_configs import GRPO_7B_8K

from labkit.cli import main

GRPO_8K = ["--model", "Qwen2.5-7B", *GRPO_7B_8K]  # old_log_prob OOMs at full width


def _memory(*args: str) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["memory", *GRPO_8K, *args, "--json"])
    return code, json.loads(out.getvalue())


def test_the_break_even_is_the_boundary_between_fits_unless_and_oom():
    """At full width: OOM in old_log_prob, with its break-even N at a 512-token prompt. Priced again with every
    sample at 512 + N tokens the verdict is "fits unless" (exit 0, full width still OOM); at 512 + N + 1, OOM."""
    code, full = _memory()
    assert (
        code == 1 and full["verdict"] == "oom" and full["first_oom"] == full["first_oom_full_width"] == "old_log_prob"
    )
    code, given = _memory("--lengths", "prompt=512,response=1500")
    n = given["break_even"]["old_log_prob"]["response_tokens"]
    assert given["break_even"]["old_log_prob"]["prompt_tokens"] == 512 and 1 < n < 1500
    code, at = _memory("--lengths", f"prompt=512,response={n}")
    assert code == 0 and at["verdict"] == "fits_unless" and at["first_oom"] is None
    assert at["first_oom_full_width"] == "old_log_prob" and at["phases"]["old_log_prob"]["state"] != "OOM"
    code, over = _memory("--lengths", f"prompt=512,response={n + 1}")
    assert code == 1 and over["verdict"] == "oom" and over["first_oom"] == "old_log_prob"


def test_a_logs_mean_lengths_price_as_the_same_numbers_given(tmp_path):
    """``--lengths log:PATH`` reads the last step's prompt_length/mean and response_length/mean (rounded up) and
    prices exactly what ``prompt=P,response=R`` prices, naming the step it read."""
    log = tmp_path / "run.log"
    log.write_text(
        "(TaskRunner pid=7) step:1 - actor/pg_loss:0.12 - prompt_length/mean:498.0 - response_length/mean:900.5\n"
        "(TaskRunner pid=7) step:2 - actor/pg_loss:0.10 - prompt_length/mean:511.3 - response_length/mean:1203.2 - "
        "perf/max_memory_allocated_gb:61.2\n"
    )
    code, from_log = _memory("--lengths", f"log:{log}")
    code_given, given = _memory("--lengths", "prompt=512,response=1204")
    assert code == code_given and from_log["phases"] == given["phases"] and from_log["verdict"] == given["verdict"]
    assert f"the means of step 2 of {log}" in from_log["lengths"]


@pytest.mark.parametrize(
    ("lengths", "says"),
    [
        ("log:{tmp}/quiet.log", "the log has no prompt_length/mean and no response_length/mean"),
        ("log:{tmp}/absent.log", "cannot read"),
        ("prompt=512,response=9000", "response"),
    ],
)
def test_bad_lengths_are_one_line_and_exit_2(tmp_path, capsys, lengths, says):
    (tmp_path / "quiet.log").write_text("step:1 - actor/pg_loss:0.12 - timing_s/step:31.0\n")
    assert main(["memory", *GRPO_8K, "--lengths", lengths.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labkit: ") and says in err and "\n" not in err and "Traceback" not in err


def test_padded_rows_are_said_to_be_full_width_whatever_the_data(capsys):
    """use_remove_padding=false: the lengths do not move the training passes: the answer says so, the phase has no
    break-even, and the given lengths price the same old_log_prob as full width."""
    padded = ["actor_rollout_ref.model.use_remove_padding=false"]
    code, full = _memory(*padded)
    code, given = _memory(*padded, "--lengths", "prompt=512,response=1000")
    assert "padded to full width whatever the data" in given["lengths"] and "packed rows" not in given["lengths"]
    assert given["phases"]["old_log_prob"] == full["phases"]["old_log_prob"]
    assert given["break_even"].get("old_log_prob", {}).get("response_tokens") is None


def test_the_chart_shows_the_break_even_above_its_phase():
    """07's and the dashboard's phase chart: the break-even written above the phase it belongs to, the same number
    the text and --json give; the capacity line named in the legend."""
    from labkit.ui.dashboard_figures import memory_figure
    from labkit.ui.memory_figures import report_for

    rep = report_for(GRPO_8K[2:], "Qwen2.5-7B", "H100-80GB", lengths="prompt=512,response=1000")
    n = rep.break_even["old_log_prob"]
    spec = memory_figure(rep)
    notes = [a for a in spec["layout"]["annotations"] if a["x"] == "old_log_prob"]
    assert [a["text"] for a in notes] == [f"fits up to {n:,} response tokens"]
    assert any(t.get("name", "").startswith("GPU capacity 79.6 GiB (as reported)") for t in spec["data"])
