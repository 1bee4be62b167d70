"""The formula against a fake-CUDA trace of the real pass at real shapes (``labkit.model.memory_trace``): the
Hugging Face decoder built from the shape, packed as use_remove_padding packs it, FA2 varlen attention, bf16
autocast, verl's head. One child process traces the whole grid (torch and transformers import once)."""

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from labkit.config.verl_config import load_config
from labkit.memory.choice import settings_for
from labkit.memory.phase_records import PassShape
from labkit.memory.phases import forward_pass, update_pass
from labkit.memory.trace_compare import TRACE_LAYERS, trace_spec, traced_settings, transient_terms
from labkit.model.trace_runner import run_traces

# (model, tokens, pass, settings changes): tied (0.5B, Qwen3-0.6B) and untied (7B, Llama-3.1-8B) embeddings, GQA
# ratios 7:1 to 2:1, 2k-64k tokens; every head flag: entropy eager / compiled / chunked / checkpointed / fused,
# flash_attn's head and verl's torch fallback, temperature ≠ 1 (the engine's copy, legacy's in place), checkpointing,
# Ulysses SP (tokens per rank)
EAGER = {"entropy_compiled": False}
PADDED = {"remove_padding": False, "response_length": 1536}  # rows of 2048 = 512 prompt + 1536 response
LEGACY = {"profile": "legacy"}
GRID = [
    ("Qwen2.5-0.5B", 4096, "ref_log_prob", {}),
    ("Qwen2.5-0.5B", 65536, "ref_log_prob", {}),
    ("Qwen2.5-0.5B", 16384, "update_actor", {}),
    ("Qwen2.5-7B", 4096, "update_actor", {}),
    ("Qwen2.5-7B", 16384, "ref_log_prob", {}),
    ("Qwen2.5-7B", 8192, "update_actor", {}),
    ("Qwen2.5-0.5B", 8192, "update_actor", {"gradient_checkpointing": False}),
    ("Qwen2.5-7B", 8192, "old_log_prob", EAGER),
    ("Qwen2.5-0.5B", 16384, "old_log_prob", EAGER),
    ("Qwen2.5-7B", 8192, "old_log_prob", {}),  # verl's default: compiled entropy
    ("Qwen3-0.6B", 4096, "old_log_prob", {**EAGER, "entropy_chunking": True}),
    ("Qwen2.5-0.5B", 4096, "old_log_prob", {"fused_kernels": True}),
    ("Llama-3.1-8B", 2048, "old_log_prob", {**EAGER, "temperature": 0.7}),  # engine: a copy
    ("Llama-3.1-8B", 2048, "old_log_prob", {**EAGER, "temperature": 0.7, "profile": "legacy"}),  # in place
    ("Qwen2.5-0.5B", 4096, "update_actor", {**EAGER, "update_entropy": True}),
    ("Qwen3-0.6B", 4096, "update_actor", {"update_entropy": True}),  # compiled
    ("Qwen2.5-0.5B", 4096, "update_actor", {**EAGER, "update_entropy": True, "entropy_chunking": True}),
    ("Qwen2.5-0.5B", 4096, "update_actor", {**EAGER, "update_entropy": True, "entropy_checkpointing": True}),
    ("Qwen2.5-0.5B", 4096, "update_actor", {"fused_kernels": True}),
    ("Qwen2.5-0.5B", 4096, "update_actor", {"fused_kernels": True, "update_entropy": True}),
    ("Qwen2.5-0.5B", 2048, "update_actor", {"logprob_kernel": "torch"}),
    ("Qwen3-0.6B", 2048, "old_log_prob", {"logprob_kernel": "torch"}),
    # Ulysses SP: the trace feeds one rank's slice of the group's micro-batch, with verl's all-to-alls in attention
    ("Qwen2.5-7B", 4096, "update_actor", {"actor_sp": 4, "gradient_checkpointing": False}),
    ("Qwen3-0.6B", 8192, "old_log_prob", {**EAGER, "actor_sp": 2}),
    # legacy's packed head: the log-probs before the entropy, flash_attn's gradient in a tensor of its own
    ("Qwen2.5-0.5B", 4096, "update_actor", {**EAGER, **LEGACY, "update_entropy": True}),
    ("Qwen3-0.6B", 4096, "update_actor", {**EAGER, **LEGACY, "update_entropy": True, "logprob_kernel": "torch"}),
    # the padded path (use_remove_padding=false): legacy's response slice and its flattened copy, the engine's
    # entropy over every padded position and its copy of the real tokens
    ("Qwen2.5-0.5B", 4096, "old_log_prob", PADDED),
    ("Qwen2.5-0.5B", 4096, "old_log_prob", {**PADDED, **LEGACY}),
    ("Qwen3-0.6B", 4096, "ref_log_prob", {**PADDED, **LEGACY}),
    ("Llama-3.1-8B", 4096, "old_log_prob", {**PADDED, **LEGACY, "temperature": 0.7}),
    ("Qwen2.5-7B", 8192, "update_actor", {**PADDED, **LEGACY}),
    ("Qwen2.5-0.5B", 4096, "update_actor", PADDED),
    ("Qwen2.5-0.5B", 4096, "update_actor", {**PADDED, **LEGACY, "update_entropy": True}),
    ("Qwen2.5-0.5B", 4096, "update_actor", {**PADDED, **LEGACY, "update_entropy": True, "logprob_kernel": "torch"}),
    ("Qwen2.5-0.5B", 4096, "update_actor", {**PADDED, "update_entropy": True, "entropy_checkpointing": True}),
    # the eager entropy at 14 bytes a logit (logsumexp's own temporary beside the fp32 softmax and copy): rows x width
    ("Qwen2.5-14B", (12, 24576), "old_log_prob", EAGER),
    ("Qwen3-8B", (4, 65536), "old_log_prob", EAGER),
    # Qwen3's q/k norms saved in fp32 and bf16 (no checkpointing: every layer's saved tensors)
    ("Qwen3-8B", 8192, "update_actor", {"gradient_checkpointing": False}),
    # MoE (transformers' Qwen3MoeForCausalLM / Qwen2MoeForCausalLM, grouped_mm experts), traced with TRACE_LAYERS
    # decoder layers and priced for as many: the routed copies saved per layer, the MoE layer's forward under the
    # fused head, the fused head's LM-head gradient beside its accumulator, a shared expert (Qwen1.5-MoE)
    ("Qwen3-30B-A3B", 8192, "update_actor", {"gradient_checkpointing": False}),
    ("Qwen3-30B-A3B", 16384, "old_log_prob", {"fused_kernels": True}),
    ("Qwen3-30B-A3B", 8192, "update_actor", {"fused_kernels": True}),
    ("Qwen3-30B-A3B", 16384, "update_actor", {}),
    ("Qwen1.5-MoE-A2.7B", 8192, "update_actor", {"gradient_checkpointing": False}),
    ("Qwen1.5-MoE-A2.7B", 16384, "old_log_prob", {"fused_kernels": True}),
    # VL (transformers' Qwen2-VL / Qwen2.5-VL / Qwen3-VL, each sample opening with an image): the tower's saved
    # tensors with and without checkpointing under the decoder's head backward, its own forward peak (rotary in
    # fp32), and the image embeddings and DeepStack features the decoder's layers run beside
    ("Qwen2.5-VL-7B-Instruct", (2, 4096), "update_actor", {"gradient_checkpointing": False}),
    ("Qwen2.5-VL-7B-Instruct", (2, 8192), "old_log_prob", {"fused_kernels": True, "image_tokens_per_sample": 3600}),
    ("Qwen3-VL-8B-Instruct", (8, 8192), "update_actor", {"image_tokens_per_sample": 1024}),
    (
        "Qwen2-VL-2B-Instruct",
        (4, 8192),
        "update_actor",
        {"image_tokens_per_sample": 1024, "gradient_checkpointing": False},
    ),
    ("Qwen3-VL-30B-A3B-Instruct", (2, 8192), "old_log_prob", {"fused_kernels": True, "image_tokens_per_sample": 3000}),
]


def _rows_tokens(case):
    size = GRID[case][1]
    return size if isinstance(size, tuple) else (2, size)


def _case(case):
    model, _, name, changes = GRID[case]
    s = replace(settings_for(load_config(None, []), model), **changes)
    fn = update_pass if name.startswith("update") else forward_pass
    phase = fn(traced_settings(s), name, PassShape(*_rows_tokens(case)))  # a MoE priced as traced: 4 layers
    return s, name, phase


@pytest.fixture(scope="module")
def traced():
    return run_traces([trace_spec(*_case(k)) for k in range(len(GRID))])


@pytest.mark.parametrize("case", range(len(GRID)))
def test_formula_within_10_percent_of_the_trace(traced, case):
    s, name, phase = _case(case)
    spec = trace_spec(s, name, phase)
    rows, tokens = _rows_tokens(case)
    assert sum(spec["seq_lengths"]) == tokens * s.actor_sp and len(spec["seq_lengths"]) == rows
    assert spec["padded"] == ("" if s.remove_padding else s.profile)
    formula = sum(transient_terms(phase).values())
    trace = traced[case]["peak_bytes"]
    detail = (
        GRID[case],
        phase.peak_instant,
        formula / 2**30,
        trace / 2**30,
        traced[case]["op"],
        traced[case]["module"],
    )
    assert 0.9 <= formula / trace <= 1.1, detail


def test_the_eager_entropy_peaks_inside_logsumexp_with_its_temporary(traced):
    """Under bf16 autocast, logsumexp reads an fp32 copy of the logits and ATen's composite allocates
    ``(x - max).exp_()`` of that size while the fp32 softmax is alive: 2 + 4 + 4 + 4 bytes a logit, which the
    formula prices (``entropy`` + ``logsumexp_temp``) and a fake tensor alone would not show."""
    for case, (model, _, name, changes) in enumerate(GRID):
        if name != "old_log_prob" or changes != EAGER:
            continue
        _, tokens = _rows_tokens(case)
        vocab = settings_for(load_config(None, []), model).model.vocab_size
        result = traced[case]
        assert result["op"] == "logsumexp", (GRID[case], result["op"])
        big = sorted((a["op"], a["dtype"]) for a in result["alive"] if a["bytes"] >= tokens * vocab * 2)
        assert big == [
            ("_softmax", "torch.float32"),
            ("_to_copy", "torch.float32"),
            ("logsumexp ((x - max).exp_())", "torch.float32"),
            ("mm", "torch.bfloat16"),
        ], GRID[case]
        phase = _case(case)[2]
        assert phase.peak_instant == "entropy" and phase.terms["logsumexp_temp"] == 4 * tokens * vocab
        assert abs(result["peak_bytes"] / (tokens * vocab) - 14) < 0.1


def test_a_moe_is_traced_with_a_few_layers_and_states_its_active_parameters(traced):
    """A MoE trace builds TRACE_LAYERS decoder layers of the real shape (the experts' routed copies alive at its
    peak); the phase says how many parameters it holds and how many a token runs through."""
    for case, (_, _, name, changes) in enumerate(GRID):
        s, _, phase = _case(case)
        spec = trace_spec(s, name, phase)
        assert spec["layers"] == (TRACE_LAYERS if s.model.is_moe else 0)
        if not s.model.is_moe:
            continue
        full = (update_pass if name.startswith("update") else forward_pass)(s, name, PassShape(*_rows_tokens(case)))
        assert full.info["total_params"] == s.model.param_count() > full.info["active_params"] > 0
        assert full.info["active_params"] == s.model.active_param_count()
        k = s.model.moe.num_experts_per_tok
        if changes == {"fused_kernels": True} and name == "old_log_prob":  # the peak among the routed copies
            _, tokens = _rows_tokens(case)
            routed = [a for a in traced[case]["alive"] if a["shape"] == [k * tokens, s.model.hidden_size]]
            assert traced[case]["module"] == "decoder" and len(routed) == 4, traced[case]["alive"][:6]


def test_op_granularity_on_fake_cuda_is_fake_cpus():
    """A CPU build sends fake ``cuda`` tensors to composite fallbacks (silu_backward as five ops); the tracer
    restores the GPU's kernels. Autocast's casts differ by device (its policies do), nothing else may."""
    cuda, cpu = run_traces(
        [{"model": "Qwen2.5-0.5B", "seq_lengths": [512, 512], "update": True, "device": d} for d in ("cuda", "cpu")]
    )
    skip = {"_to_copy", "device"}
    assert {k: v for k, v in cuda["ops"].items() if k not in skip} == {
        k: v for k, v in cpu["ops"].items() if k not in skip
    }
    assert cuda["ops"]["silu_backward"] == 24  # one per layer, not its composite
    assert "sigmoid" not in cuda["ops"]


def test_a_ulysses_rank_holds_its_slice_and_all_to_alls():
    """SP = 2: the rank's logits hold half the group's tokens, and attention's all-to-alls ran (each layer gathers
    q, k, v and scatters the output back: a concatenation per all-to-all)."""
    one, two = run_traces([{"model": "Qwen2.5-0.5B", "seq_lengths": [2048, 2048], "sp": sp} for sp in (1, 2)])
    logits = [a for a in two["alive"] if a["shape"][-1] == 151936]
    assert logits and logits[0]["shape"][0] == 2048
    assert two["ops"].get("cat", 0) >= 4 * 24 > one["ops"].get("cat", 0)


PADDED_CLI = [
    "--profile",
    "legacy",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "data.train_batch_size=32",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.ppo_micro_batch_size_per_gpu=4",  # GAE's critic: verl rejects the config without it (E13)
    "data.max_prompt_length=512",
    "data.max_response_length=1536",
    "actor_rollout_ref.actor.use_remove_padding=false",
    "actor_rollout_ref.actor.use_torch_compile=false",
]


MARK = f"labkit-test-{os.getpid()}"


def _labkit(*args: str) -> subprocess.CompletedProcess:
    """The CLI, its processes marked in their environment (``_marked`` finds them)."""
    exe = Path(sys.executable).with_name("labkit")
    env = {**os.environ, "LABKIT_TEST_MARK": MARK}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300, env=env)


def test_cli_traces_the_padded_path_as_the_config_reads_it():
    """``labkit memory --trace`` on a legacy config with use_remove_padding=false: 4 rows padded to 2,048, the
    head on the 1,536 response positions, the plain entropy (no compile on the padded path), formula within 10%."""
    out = _labkit("memory", *PADDED_CLI, "--trace", "old_log_prob", "--json")
    assert out.returncode == 0, out.stderr
    traced = json.loads(out.stdout)["trace"]["spec"]
    assert traced["padded"] == "legacy" and traced["width"] == 2048 and traced["response_length"] == 1536
    assert traced["entropy"] == "eager" and traced["seq_lengths"] == [2048] * 4
    text = _labkit("memory", *PADDED_CLI, "--trace", "old_log_prob").stdout
    ratio = float(re.search(r"formula / trace = ([0-9.]+)", text).group(1))
    assert "4 rows padded to 2,048" in text and 0.9 <= ratio <= 1.1, text[-1500:]


def test_a_config_error_with_trace_leaves_no_tracer_behind():
    """The trace child starts before the config is read; a config verl's reader refuses (exit 2) stops it."""
    out = _labkit("memory", "data.train_batch_size=abc", "--trace")
    assert out.returncode == 2 and "internal error" not in out.stderr
    assert _marked() == set()


def _marked() -> set[int]:
    """Live processes this test's CLI runs started (their environment holds ``MARK``)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"LABKIT_TEST_MARK={MARK}".encode() in env.split(b"\0"):
            found.add(int(pid))
    return found
