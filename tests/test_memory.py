"""labkit.memory: the per-phase model's invariants, the textbook 16 bytes/param, ``labkit memory`` (--json, exit
codes, < 50 ms), and known OOM reports of verl users: the verdict they saw and the fix that worked for them."""

import contextlib
import io
import json
import random
import time
from dataclasses import replace

import pytest
from _known_configs import GRPO_7B_8K

from labkit.cli import main
from labkit.config.verl_config import load_config
from labkit.memory.model_catalogue import model_names, model_shape
from labkit.memory.phase_records import PassShape
from labkit.memory.phases import forward_pass, update_pass
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import ORDER, fill_bytes_predicted, trace_phases
from labkit.memory.terms import TERMS
from labkit.memory.verdict import memory_report
from labkit.plan.step import plan

GiB = 2**30
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
# the user: "compute_log_prob OOMs on 8×H100 80 GB with Qwen2.5-7B and 8k responses: what do I change?"
USER = GRPO_7B_8K


def _settings(overrides=(), model="Qwen2.5-7B", gib=80, profile="engine", **over):
    cfg = load_config(None, list(overrides), profile=profile)
    return cfg, MemorySettings.from_config(cfg, model, gib * GiB, **over)


def _memory_json(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["memory", *args, "--json"])
    return code, json.loads(out.getvalue())


@pytest.mark.parametrize("name", model_names())
def test_model_states_are_the_textbook_16_bytes_per_param(name):
    """fp32 params + fp32 grads + Adam m, v = 16 bytes per parameter, sharded over the FSDP world."""
    for world in (1, 8):
        _, s = _settings([f"trainer.n_gpus_per_node={world}"], model=name)
        phase = update_pass(s, "update_actor", PassShape(1, 1))
        states = sum(phase.instants["optimizer_step"][k] for k in ("params", "grads", "optimizer"))
        assert abs(states - 16 * model_shape(name).param_count() / world) <= 16, (name, world)


def test_more_rows_or_tokens_never_predict_less_offload_and_checkpointing_never_more():
    rng = random.Random(0)
    for _ in range(60):
        model = rng.choice(model_names())
        flags = {k: rng.random() < 0.5 for k in ("param_offload", "optimizer_offload", "gradient_checkpointing")}
        _, s = _settings([f"trainer.n_gpus_per_node={rng.choice([1, 2, 8])}"], model=model, **flags)
        s = replace(
            s, update_entropy=rng.random() < 0.5, logprob_kernel=rng.choice(["full_log_softmax", "flash_attn", "torch"])
        )
        rows, tokens = rng.randint(1, 16), rng.randint(1, 40000)
        for name in ("old_log_prob", "ref_log_prob", "update_actor"):
            fn = update_pass if name.startswith("update") else forward_pass

            def peak(st, r=rows, t=tokens, f=fn, n=name):
                return f(st, n, PassShape(r, t)).peak_bytes

            assert peak(s, t=tokens + rng.randint(1, 5000)) >= peak(s)
            assert peak(s, r=rows + 1) >= peak(s)
            for knob in ("param_offload", "optimizer_offload", "ref_param_offload", "offload_policy"):
                assert peak(replace(s, **{knob: True})) <= peak(s), knob
            if tokens >= 3 * s.entropy_chunk_size:  # below that, 3 fp32 chunks outweigh 2 bf16 full temporaries
                assert peak(replace(s, entropy_chunking=True)) <= peak(s)
            assert peak(replace(s, gradient_checkpointing=True)) <= peak(replace(s, gradient_checkpointing=False))


def test_every_term_is_named_and_peaks_are_sums_of_terms():
    code, doc = _memory_json(*USER, "--model", "Qwen2.5-7B", "--gpu-memory", "80GiB")
    assert code == 1 and doc["first_oom"] == "old_log_prob"
    assert set(doc) == {
        "phases", "verdict", "first_oom", "first_oom_full_width", "break_even", "fixes", "capacity_bytes",
        "margin_bytes", "lengths", "verl_error", "verl_message", "not_priced", "combined_fix", "way_out",
    }  # fmt: skip
    assert doc["verdict"] == "oom" and doc["first_oom_full_width"] == "old_log_prob"
    assert doc["capacity_bytes"] == 80 * GiB and doc["margin_bytes"] == 2 * GiB and "full width" in doc["lengths"]
    assert all(set(p) == {"peak_bytes", "terms", "state", "left_bytes"} for p in doc["phases"].values())
    for phase in doc["phases"].values():
        assert phase["left_bytes"] == 80 * GiB - phase["peak_bytes"]
        assert phase["state"] == (
            "OOM" if phase["left_bytes"] < 0 else "tight" if phase["left_bytes"] < 2 * GiB else "fits"
        )
    assert all(isinstance(p["peak_bytes"], int) for p in doc["phases"].values())
    assert list(doc["phases"]) == [p for p in ORDER if p in doc["phases"]]
    for name, phase in doc["phases"].items():
        assert set(phase["terms"]) <= set(TERMS), set(phase["terms"]) - set(TERMS)
        assert phase["peak_bytes"] == sum(phase["terms"].values()), name
    assert doc["phases"]["update_actor"]["peak_bytes"] < 80 * GiB < doc["phases"]["old_log_prob"]["peak_bytes"]
    fixes = {f["knob"]: f for f in doc["fixes"]}
    assert fixes[f"{A}.entropy_from_logits_with_chunking"]["step_fits"]
    # 4 rows of 9,216 tokens hold 14 bytes a logit at the eager entropy's logsumexp (92 GiB with the states); 2 fit
    assert fixes[f"{R}.log_prob_micro_batch_size_per_gpu"]["set"] == f"{R}.log_prob_micro_batch_size_per_gpu=2"
    assert fixes["actor_rollout_ref.model.use_fused_kernels"]["step_fits"]
    assert all(f["new_peak_bytes"] < doc["phases"][f["phase"]]["peak_bytes"] for f in doc["fixes"])


def test_memory_answers_in_under_50_ms_and_fills_the_plan():
    main(["memory", *USER, "--model", "Qwen2.5-7B"])  # warm imports
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            main(["memory", *USER, "--model", "Qwen2.5-7B", "--gpu-memory", "80GiB"])
        best = min(best, time.perf_counter() - t0)
    assert best < 0.05, best
    cfg, s = _settings(
        [
            "data.train_batch_size=8",
            f"{R}.n=2",
            "trainer.n_gpus_per_node=2",
            f"{A}.ppo_mini_batch_size=4",
            f"{A}.ppo_micro_batch_size_per_gpu=2",
            f"{R}.log_prob_micro_batch_size_per_gpu=2",
            "algorithm.adv_estimator=grpo",
        ],
        model="tiny-qwen2",
    )
    tr = fill_bytes_predicted(plan(cfg, "gsm8k-like"), cfg, s)
    for stage in ("generate", "old_log_prob", "update_actor"):
        assert all(r.bytes_predicted and r.bytes_predicted > 0 for r in tr.at(stage)), stage
    assert all(r.bytes_predicted is None for r in tr.at("dataloader"))


def test_bad_input_is_a_clear_error():
    for args in (["--model", "GPT-5"], ["--gpu-memory", "12XB"], ["--gpu", "TPU"]):
        with contextlib.redirect_stderr(io.StringIO()) as err:
            assert main(["memory", *args]) == 2
        assert "labkit:" in err.getvalue() and "Traceback" not in err.getvalue()


def test_verl_verdict_comes_first_and_an_unset_model_is_verls_default(capsys):
    """verl's bare defaults: no micro-batch size (verl raises E7 at start-up) and no model.path (verl loads
    ~/models/deepseek-llm-7b-chat). The answer says both before any memory, exits 1, and the JSON carries the
    message ``check`` prints."""
    assert main(["memory"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("note: actor_rollout_ref.model.path is not set") and "deepseek-llm-7b-chat" in lines[0]
    assert lines[1].startswith("verl rejects this config (E7): [actor] Please set at least one of")
    assert "DeepSeek-LLM-7B" in lines[2] and lines[-1].startswith("verdict:")
    assert main(["memory", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    main(["check"])
    said = capsys.readouterr().out.splitlines()[1]  # "AssertionError (E7): <verl's message>"
    assert doc["verl_error"] == "E7" and said.endswith(f"(E7): {doc['verl_message']}")
    assert main(["memory", "--model", "Qwen2.5-7B", f"{A}.use_dynamic_bsz=true"]) == 0  # named: no note, accepted
    assert not capsys.readouterr().out.startswith(("note:", "verl rejects"))


def test_a_model_that_does_not_fit_at_one_row_says_so():
    """72B on one 80 GB GPU: 16 bytes/param alone is 1.1 TB; no knob labkit models makes it fit."""
    cfg, s = _settings(
        [
            "trainer.n_gpus_per_node=1",
            f"{R}.tensor_model_parallel_size=1",
            "data.train_batch_size=1",
            f"{A}.ppo_mini_batch_size=1",
            f"{A}.ppo_micro_batch_size_per_gpu=1",
            f"{R}.log_prob_micro_batch_size_per_gpu=1",
            "algorithm.adv_estimator=grpo",
        ],
        model="Qwen2.5-72B",
    )
    rep = memory_report(cfg, s)
    assert rep.first_oom == "generate"
    assert rep.fixes and not any(f["step_fits"] for f in rep.fixes)


# ---- known cases: what verl users reported ---------------------------------------------------------------------
def test_known_dynamic_budget_is_multiplied_by_sp():
    """A user set ppo_max_token_len_per_gpu and raised Ulysses SP expecting less memory per GPU, and still OOMed:
    the budget is multiplied by SP before the split, so each GPU still feeds the whole budget. Halving the budget
    is what fits."""
    base = [*USER, f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=65536", "trainer.n_gpus_per_node=8"]
    peaks = {}
    for sp in (1, 2):
        cfg, s = _settings([*base, f"{A}.ulysses_sequence_parallel_size={sp}"], gib=40)
        rep = memory_report(cfg, s)
        peaks[sp] = rep.phases["update_actor"]
        assert rep.phases["update_actor"].info["tokens"] == 65536
    assert peaks[2].peak_bytes == peaks[1].peak_bytes > 40 * GiB
    cfg, s = _settings([*base, f"{A}.ulysses_sequence_parallel_size=2", f"{A}.ppo_max_token_len_per_gpu=32768"], gib=40)
    assert memory_report(cfg, s).phases["update_actor"].peak_bytes < 40 * GiB


def test_known_long_responses_oom_with_static_micro_batches():
    """16k responses on a 7B over 8 GPUs OOMed with static micro-batches (they count samples, not tokens); the
    advice that worked: dynamic batch size (a token budget) — labkit's fixes hold it, and it fits."""
    cfg, s = _settings(
        [
            *USER[:4],
            f"{R}.log_prob_micro_batch_size_per_gpu=8",
            "data.max_prompt_length=1024",
            "data.max_response_length=16384",
            "algorithm.adv_estimator=grpo",
            f"{A}.fsdp_config.use_torch_compile=false",
        ]
    )
    rep = memory_report(cfg, s)
    assert rep.first_oom is not None
    dynamic = [f for f in rep.fixes if "use_dynamic_bsz=true" in f["set"] and f["phase"] == rep.first_oom]
    assert dynamic and dynamic[0]["fits"]


def test_known_legacy_budget_is_not_a_cap():
    """Lengths [7]*8 with a budget of 8 tokens: legacy's Karmarkar-Karp puts 14 tokens in one micro-batch (more
    memory than the budget promises); the engine's hard cap never exceeds it."""
    over = [
        "data.train_batch_size=8",
        f"{R}.n=1",
        "trainer.n_gpus_per_node=1",
        f"{R}.tensor_model_parallel_size=1",
        f"{A}.ppo_mini_batch_size=8",
        f"{A}.use_dynamic_bsz=true",
        f"{A}.ppo_max_token_len_per_gpu=8",
        "data.max_prompt_length=4",
        "data.max_response_length=4",
        "algorithm.adv_estimator=grpo",
    ]
    tokens = {}
    for profile in ("legacy", "engine"):
        cfg, s = _settings(over, model="tiny-qwen2", profile=profile)
        tokens[profile] = trace_phases(plan(cfg, [7] * 8), cfg, s)["update_actor"].info["tokens"]
    assert tokens["engine"] <= 8 < tokens["legacy"] == 14


def test_known_entropy_over_full_logits_in_old_log_prob():
    """The old-log-prob recompute (legacy dp_actor) OOMed on ~12k-token micro-batches: the entropy over the full
    [tokens, vocab] logits costs 6-7 GiB more than the log-probs; ref_log_prob (no entropy) fits, and chunked
    entropy fixes it."""
    cfg, s = _settings(
        [
            *USER,
            f"{R}.log_prob_use_dynamic_bsz=true",
            f"{R}.log_prob_max_token_len_per_gpu=12288",
            f"{A}.ppo_micro_batch_size_per_gpu=1",
            f"{R}.gpu_memory_utilization=0.4",
            f"{A}.use_kl_loss=true",
            f"{A}.use_torch_compile=false",  # the legacy workers' key (the engine's is fsdp_config's)
            "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=12288",
        ],
        gib=26,
        profile="legacy",
    )
    rep = memory_report(cfg, s)
    old, ref = rep.phases["old_log_prob"], rep.phases["ref_log_prob"]
    assert old.peak_instant == "entropy" and old.terms["entropy"] == 8 * 12288 * 152064  # fp32 softmax and p·z
    assert rep.first_oom == "old_log_prob" and ref.peak_bytes < 26 * GiB
    chunked = [f for f in rep.fixes if f["knob"] == f"{A}.entropy_from_logits_with_chunking"]
    assert chunked and chunked[0]["fits"]


def test_known_budget_below_the_longest_sequence():
    """A budget of 16,384 with 40,960-token sequences is refused by verl (the budget must hold the longest
    sequence); raising it to 50k then OOMed (here: a 7B on 40 GB GPUs). labkit predicts that OOM, never proposes a
    budget below the longest sequence, and offers fixes that keep the budget (chunked entropy)."""
    over = [
        *USER[:5],
        "data.max_prompt_length=8192",
        "data.max_response_length=32768",
        "algorithm.adv_estimator=grpo",
        f"{A}.use_dynamic_bsz=true",
        f"{A}.ppo_max_token_len_per_gpu=50000",
        f"{R}.log_prob_max_token_len_per_gpu=50000",
        f"{A}.fsdp_config.use_torch_compile=false",
    ]
    cfg, s = _settings(over, gib=40)
    rep = memory_report(cfg, s)
    assert rep.first_oom == "old_log_prob"
    assert any(f["fits"] and f["knob"] == f"{A}.entropy_from_logits_with_chunking" for f in rep.fixes)
    for f in rep.fixes:
        for part in f["set"].split(", "):
            if "max_token_len" in part:
                assert int(part.split("=")[1]) >= 40960, f


def test_docs_list_every_term():
    from pathlib import Path

    from labkit.memory.terms import terms_markdown

    page = (Path(__file__).resolve().parent.parent / "docs" / "memory.md").read_text()
    assert terms_markdown() in page, "docs/memory.md's term table is stale: paste terms_markdown()"


def test_the_notebook_panel_answers_within_100_ms():
    from labkit.memory.answer_text import render_text
    from labkit.ui import memory_figures

    memory_figures.phase_stack(memory_figures.report_for(USER, "Qwen2.5-7B", "H100-80GB"))  # warm
    best = float("inf")
    for model, gpu_name in (("Qwen3-8B", "A100-80GB"), ("Llama-3.1-70B", "H200"), ("Qwen2.5-0.5B", "L40S")):
        t0 = time.perf_counter()
        rep = memory_figures.report_for([*USER, "data.max_response_length=4096"], model, gpu_name)
        memory_figures.phase_stack(rep)
        render_text(rep)
        best = min(best, time.perf_counter() - t0)
    assert best < 0.1, best
    import ipywidgets as W

    box = memory_figures.memory_panel(USER, "Qwen2.5-7B", "H100-80GB")
    sizes = [w for col in box.children[1].children for w in col.children if isinstance(w, W.IntText)]
    assert len(sizes) == len(memory_figures.SIZES)
    sizes[0].value = 4  # a change redraws without raising


def test_gae_step_has_critic_phases_and_critic_offload_never_costs_more():
    cfg, s = _settings([*USER[:-1], "algorithm.adv_estimator=gae"], model="Qwen2.5-1.5B")
    rep = memory_report(cfg, s)
    assert list(rep.phases) == ["generate", "old_log_prob", "values", "update_critic", "update_actor"]
    off = replace(s, critic_param_offload=True, critic_optimizer_offload=True)
    for name in ("generate", "old_log_prob", "update_actor"):
        assert "critic_params" in rep.phases[name].instants[rep.phases[name].peak_instant]
        assert memory_report(cfg, off).phases[name].peak_bytes < rep.phases[name].peak_bytes, name
    assert memory_report(cfg, off).phases["update_critic"].peak_bytes == rep.phases["update_critic"].peak_bytes
