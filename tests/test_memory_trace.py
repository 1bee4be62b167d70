"""The formula against a fake-CUDA trace of the real pass at real shapes (``labkit.model.memory_trace``): the
Hugging Face decoder built from the shape, packed as use_remove_padding packs it, FA2 varlen attention, bf16
autocast, verl's head. One child process traces the whole grid (torch and transformers import once)."""

from dataclasses import replace

import pytest

from labkit.config.verl_config import load_config
from labkit.memory.choice import settings_for
from labkit.memory.phases import PassShape, forward_pass, update_pass
from labkit.memory.trace_compare import transient_terms
from labkit.model.trace_runner import run_traces

# (model, tokens, pass, checkpointing): tied (0.5B) and untied (7B) embeddings, 4k-16k tokens; old_log_prob here
# with the eager entropy (actor.use_torch_compile=false), whose fp32 softmax and product the trace holds
GRID = [
    ("Qwen2.5-0.5B", 4096, "ref_log_prob", True),
    ("Qwen2.5-0.5B", 16384, "update_actor", True),
    ("Qwen2.5-7B", 4096, "update_actor", True),
    ("Qwen2.5-7B", 16384, "ref_log_prob", True),
    ("Qwen2.5-7B", 8192, "update_actor", True),
    ("Qwen2.5-0.5B", 8192, "update_actor", False),
    ("Qwen2.5-7B", 8192, "old_log_prob", True),
    ("Qwen2.5-0.5B", 16384, "old_log_prob", True),
]
EAGER = ["actor_rollout_ref.actor.use_torch_compile=false"]


@pytest.fixture(scope="module")
def traced():
    specs = [
        {
            "model": m,
            "seq_lengths": [t // 2, t // 2],
            "update": p.startswith("update"),
            "checkpointing": ck,
            "entropy": "eager" if p == "old_log_prob" else "none",
        }
        for m, t, p, ck in GRID
    ]
    return run_traces(specs)


@pytest.mark.parametrize("case", range(len(GRID)))
def test_formula_within_10_percent_of_the_trace(traced, case):
    model, tokens, name, ckpt = GRID[case]
    s = replace(settings_for(load_config(None, EAGER), model), gradient_checkpointing=ckpt)
    assert not s.entropy_compiled
    fn = update_pass if name.startswith("update") else forward_pass
    formula = sum(transient_terms(fn(s, name, PassShape(2, tokens))).values())
    trace = traced[case]["peak_bytes"]
    assert 0.9 <= formula / trace <= 1.1, (GRID[case], formula / 2**30, trace / 2**30, traced[case]["op"])


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
