"""The shipped tiny Qwen2 (data/tiny-qwen2): offline loading, tokenizer fidelity, provenance, reward, generation."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from labkit.model.tiny_model import (
    MAX_PROMPT_TOKENS,
    MAX_RESPONSE_TOKENS,
    REPO_ROOT,
    TINY_MODEL_DIR,
    build_tokenizer,
    count_params,
    generate_answers,
    load_tiny_model,
    load_tiny_tokenizer,
    make_prompts,
)
from labkit.model.tiny_task import EOS_TOKEN, MAX_ANSWER_LEN, OPS, make_examples, reference_answer
from labkit.rl.reward import compute_score, compute_scores

SCRIPT = REPO_ROOT / "scripts" / "train_tiny_model.py"
REPORT = json.loads((TINY_MODEL_DIR / "train_report.json").read_text())
K_STEPS = 4


def _script_module():
    spec = importlib.util.spec_from_file_location("train_tiny_model", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tok():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_tiny_model()


def test_shipped_files_fp32_and_small():
    names = {p.name for p in TINY_MODEL_DIR.iterdir()}
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "train_report.json",
    ]:
        assert f in names, f
    from safetensors import safe_open

    with safe_open(str(TINY_MODEL_DIR / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"F32"}
    assert (TINY_MODEL_DIR / "model.safetensors").stat().st_size < 10 * 2**20


def test_loads_offline_with_auto_classes():
    """A fresh interpreter with HF_HUB_OFFLINE=1 loads both through the Auto classes (no local_files_only hint)."""
    code = (
        "import sys, torch; from transformers import AutoModelForCausalLM, AutoTokenizer;"
        f"m = AutoModelForCausalLM.from_pretrained({str(TINY_MODEL_DIR)!r}); t = AutoTokenizer.from_pretrained({str(TINY_MODEL_DIR)!r});"
        "print(type(m).__name__, type(t).__name__, m.dtype, t.pad_token, t.eos_token, t.padding_side)"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME="/nonexistent-hf-home")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Qwen2ForCausalLM", "Qwen2Tokenizer", "torch.float32", EOS_TOKEN, EOS_TOKEN, "left"]


def test_autotokenizer_ids_equal_tokenizer_json_and_round_trip(tok, model):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(TINY_MODEL_DIR / "tokenizer.json"))
    assert type(tok).__name__ == "Qwen2Tokenizer"  # the trap: AutoTokenizer rebuilds Qwen2's pipeline
    texts = [ex.prompt + ex.answer + EOS_TOKEN for ex in make_examples(400, seed=123)]
    texts += ["rev 0=", "add 0+0=0", "sum 99=18" + EOS_TOKEN * 3, " leading space", "Hello, wörld! 12 ab\n"]
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert ids == raw.encode(t, add_special_tokens=False).ids, t
        assert tok.decode(ids) == t
    assert len(tok) == raw.get_vocab_size() == model.config.vocab_size
    assert tok.pad_token_id == tok.eos_token_id == tok.convert_tokens_to_ids(EOS_TOKEN)


def test_tokenizer_is_the_scripts_tokenizer(tok):
    rebuilt = build_tokenizer(seed=REPORT["seed"])
    assert rebuilt.get_vocab() == tok.get_vocab()
    shipped = json.loads((TINY_MODEL_DIR / "tokenizer.json").read_text())["model"]["merges"]
    assert json.loads(rebuilt.backend_tokenizer.to_str())["model"]["merges"] == shipped


def test_architecture_and_param_count(model):
    cfg = model.config
    n = count_params(model)
    assert 1_000_000 <= n <= 5_000_000
    assert n == REPORT["n_params"]
    assert cfg.model_type == "qwen2" and cfg.num_attention_heads == 4 and cfg.num_key_value_heads == 2
    assert cfg.intermediate_size % 4 == 0 and cfg.hidden_size % cfg.num_attention_heads == 0
    assert cfg.eos_token_id == cfg.pad_token_id == load_tiny_tokenizer().eos_token_id


def test_make_prompts_seeded_and_short(tok):
    a, b = make_prompts(64, seed=5, tokenizer=tok), make_prompts(64, seed=5, tokenizer=tok)
    assert a == b and a["texts"] != make_prompts(64, seed=6, tokenizer=tok)["texts"]
    assert max(len(x) for x in a["input_ids"]) <= MAX_PROMPT_TOKENS
    assert {len(tok(x, add_special_tokens=False)["input_ids"]) for x in a["answers"]} <= set(
        range(1, MAX_ANSWER_LEN + 1)
    )
    assert MAX_ANSWER_LEN + 1 <= MAX_RESPONSE_TOKENS
    assert set(a["ops"]) == set(OPS)


@pytest.mark.parametrize(
    "prompt,response,expected",
    [
        ("rev 3917=", "7193", 1.0),  # correct, EOS stripped by the decoder
        ("rev 3917=", "7193" + EOS_TOKEN, 1.0),  # correct, EOS kept
        ("rev 3917=", "7193" + EOS_TOKEN + "55" + EOS_TOKEN * 2, 1.0),  # tokens after EOS are ignored
        ("rev 3917=", "3917" + EOS_TOKEN, 0.0),  # wrong
        ("rev 3917=", "719" + EOS_TOKEN, 0.0),  # truncated answer
        ("rev 3917=", "71935" + EOS_TOKEN, 0.0),  # extra tokens before EOS
        ("rev 3917=", "", 0.0),  # empty
        ("sort 3917=", "1379", 1.0),
        ("desc 3917=", "9731", 1.0),
        ("desc 3917=", "1379", 0.0),
        ("miss 0123456=", "789", 1.0),
        ("miss 0123456=", "78", 0.0),
        ("len 0070=", "4", 1.0),
        ("max 3917=", "9", 1.0),
        ("max 3917=", "09", 0.0),
        ("sort 3917=", " 1379", 0.0),  # a leading space is not the answer
        ("len 1234567890=", "10" + EOS_TOKEN, 1.0),
        (EOS_TOKEN * 3 + "rev 90=", "09", 1.0),  # left-padded prompt text
    ],
)
def test_compute_score_hand_cases(prompt, response, expected):
    assert compute_score(prompt, response) == expected


def test_compute_score_format_credit_ids_and_errors(tok):
    assert compute_score("rev 12=", "12", format_score=0.1) == 0.1  # well-formed but wrong
    assert compute_score("rev 12=", "x2", format_score=0.1) == 0.0  # malformed
    assert compute_score("rev 12=", "21", format_score=0.1) == 1.0
    ids = (
        [tok.pad_token_id] * 2
        + tok("miss 0123456789=", add_special_tokens=False)["input_ids"][:-3]
        + tok("=")["input_ids"]
    )
    assert compute_score(ids, "89" + EOS_TOKEN) == 1.0 and compute_score(ids, "98") == 0.0
    assert compute_scores(["len 5555555555=", "rev 10="], ["10", "10"]) == [1.0, 0.0]
    for ex in make_examples(300, seed=9):
        assert reference_answer(ex.prompt) == ex.answer and compute_score(ex.prompt, ex.answer) == 1.0
    with pytest.raises(ValueError, match="not a tiny-task prompt"):
        compute_score("mul 12=", "2")
    with pytest.raises(ValueError, match="not a tiny-task prompt"):
        reference_answer("add 1+2=")
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        compute_scores(["rev 1=", "rev 2="], ["1"])


def test_first_k_steps_reproduce_recorded_losses(tmp_path):
    """Re-run the script's first K steps: same config and tokenizer, and the same losses the shipped run recorded.

    Bit-exact when torch version, CPU capability and thread count match the recording (deterministic CPU kernels);
    on another platform kernels may round differently and 1e-5 relative is allowed.
    """
    r = REPORT
    argv = [
        "--steps",
        str(K_STEPS),
        "--out",
        str(tmp_path),
        "--no-eval",
        "--seed",
        str(r["seed"]),
        "--total-steps",
        str(r["total_steps"]),
        "--batch-size",
        str(r["batch_size"]),
        "--lr",
        str(r["lr"]),
        "--warmup",
        str(r["warmup"]),
        "--weight-decay",
        str(r["weight_decay"]),
        "--threads",
        str(r["threads"]),
    ]
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        mine = _script_module().main(argv)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads(
        (TINY_MODEL_DIR / "config.json").read_text()
    )
    assert (tmp_path / "tokenizer.json").read_text() == (TINY_MODEL_DIR / "tokenizer.json").read_text()
    assert len(mine["losses"]) == K_STEPS
    if (mine["torch"], mine["cpu_capability"]) == (r["torch"], r["cpu_capability"]):
        assert mine["losses"] == r["losses"][:K_STEPS]
    else:
        assert mine["losses"] == pytest.approx(r["losses"][:K_STEPS], rel=1e-5)
    assert mine["losses"][-1] < mine["losses"][0]  # it trains


def test_shipped_weights_reach_the_stated_eval_loss(model, tok):
    mod = _script_module()
    loss = mod.eval_loss(model, tok)
    assert loss == pytest.approx(REPORT["eval_loss"], rel=1e-5)  # these weights are the ones the report evaluated
    assert loss < mod.MAX_EVAL_LOSS == REPORT["max_eval_loss"]
    assert REPORT["steps"] == REPORT["total_steps"]  # the shipped run is a complete run, not a --steps prefix


def test_greedy_answers_vary_in_length_and_end_with_eos(model, tok):
    p = make_prompts(16, seed=2024, tokenizer=tok)
    g = generate_answers(model, tok, p["texts"])
    assert all(g["ended_with_eos"]) and all(r[-1] == tok.eos_token_id for r in g["response_ids"])
    assert len(set(g["lengths"])) >= 4, g["lengths"]
    assert max(g["lengths"]) <= MAX_RESPONSE_TOKENS
    assert all(re.fullmatch(r"[0-9]+" + re.escape(EOS_TOKEN), t) for t in g["texts"]), g["texts"]


def test_decent_but_not_perfect(model, tok):
    """GRPO needs headroom: greedy exact match on held-out prompts between 30% and 90%, T=1.0 sampling lower."""
    p = make_prompts(128, seed=_script_module().EVAL_SEED, tokenizer=tok)
    greedy = compute_scores(p["texts"], generate_answers(model, tok, p["texts"])["texts"])
    assert 0.3 <= sum(greedy) / 128 <= 0.9
    assert 0.2 <= REPORT["eval"]["sampled_t1"]["accuracy"] <= 0.8
    assert REPORT["eval"]["sampled_t1"]["accuracy"] < REPORT["eval"]["greedy"]["accuracy"]


def test_seeded_sampling_is_reproducible(model, tok):
    texts = make_prompts(16, seed=11, tokenizer=tok)["texts"]
    a = generate_answers(model, tok, texts, do_sample=True, temperature=1.0, seed=7)
    b = generate_answers(model, tok, texts, do_sample=True, temperature=1.0, seed=7)
    c = generate_answers(model, tok, texts, do_sample=True, temperature=1.0, seed=8)
    assert a == b
    assert a["response_ids"] != c["response_ids"]
