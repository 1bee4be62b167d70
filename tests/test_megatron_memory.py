"""labkit.memory.megatron_memory against its witness, a trace of megatron-core 0.16.1's own GPTModel and pipeline
schedule on fake CUDA tensors with a fake process group (labkit.model.trace_megatron), and its invariants."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest

from labkit.memory.megatron_activations import Recompute, StageInputs, in_flight, stage_activations
from labkit.memory.megatron_memory import PHASES, megatron_memory, stage_phase
from labkit.memory.megatron_params import Residency, model_states, stage_params
from labkit.memory.megatron_terms import MEGATRON_TERMS, megatron_terms_markdown
from labkit.memory.model_catalogue import model_names, model_shape
from labkit.model.trace_megatron import ORACLE
from labkit.plan.pipeline_schedule import pipeline_schedule
from labkit.rules.parallel_layout import ParallelLayout

STATES = ("bf16_params", "fp32_main_grads", "optimizer_states", "ref_bf16_params")


def _spec(name, layers, tp, pp, cp, dp, stage, tokens, mb, vpp=None, ep=1, etp=None, fo=False, entropy=False, rc=None):
    return dict(
        name=name, layers=layers, tp=tp, pp=pp, cp=cp, dp=dp, stage=stage, tokens=tokens, micro_batches=mb,
        vpp=vpp, ep=ep, etp=etp, forward_only=fo, entropy=entropy, recompute=rc,
    )  # fmt: skip


FULL_UNIFORM = {"granularity": "full", "method": "uniform", "num_layers": 1}
FULL_BLOCK = {"granularity": "full", "method": "block", "num_layers": 2}
SELECTIVE = {"granularity": "selective", "modules": ["core_attn", "mlp"]}
GRID = [  # dense and MoE; TP, PP (first, middle, last stage), VPP, CP, EP/ETP; recompute off/full/selective; 4k-32k
    _spec("Qwen2.5-0.5B", 8, 2, 2, 1, 2, 0, 4096, 4),
    _spec("Qwen2.5-7B", 4, 4, 4, 1, 1, 1, 16384, 8),
    _spec("Qwen2.5-7B", 4, 4, 4, 1, 1, 3, 16384, 8),
    _spec("Llama-3.1-8B", 4, 2, 2, 1, 2, 0, 8192, 4, vpp=2),
    _spec("Qwen3-8B", 4, 2, 1, 2, 2, 0, 16384, 2),
    _spec("Qwen3-8B", 8, 1, 2, 1, 2, 0, 32768, 4, rc=FULL_UNIFORM),
    _spec("Qwen3-8B", 8, 2, 2, 1, 2, 0, 32768, 4, rc=FULL_BLOCK),
    _spec("Qwen3-8B", 8, 2, 2, 1, 2, 1, 8192, 4, rc=SELECTIVE),
    _spec("Qwen3-30B-A3B", 4, 2, 2, 1, 4, 0, 4096, 4, ep=4, etp=1),
    _spec("Qwen3-30B-A3B", 4, 2, 2, 1, 4, 1, 4096, 4, ep=4, etp=2),
    _spec("Qwen3-30B-A3B", 4, 2, 2, 1, 4, 0, 4096, 4, ep=4, etp=1, fo=True),
    _spec("Qwen1.5-MoE-A2.7B", 4, 2, 2, 1, 2, 0, 8192, 4, ep=2, etp=1),
    _spec("Qwen2.5-0.5B", 8, 2, 2, 1, 2, 1, 4096, 4, fo=True, entropy=True),
    _spec("Qwen2.5-0.5B", 8, 2, 2, 1, 2, 1, 4096, 4, fo=True),
]


def _model(spec):
    return replace(model_shape(spec["name"]), num_hidden_layers=spec["layers"])


def _layout(spec, distributed_optimizer=True):
    s = spec
    world = s["tp"] * s["pp"] * s["cp"] * s["dp"]
    return ParallelLayout(
        "megatron", world, tp=s["tp"], pp=s["pp"], vpp=s["vpp"], cp=s["cp"], ep=s["ep"], etp=s["etp"] or s["tp"],
        sequence_parallel=s["tp"] > 1, use_distributed_optimizer=distributed_optimizer,
    )  # fmt: skip


def _formula(spec):
    rc = spec["recompute"] or {}
    recompute = Recompute(rc.get("granularity"), rc.get("method"), rc.get("num_layers"), tuple(rc.get("modules", ())))
    phase = ("old_log_prob" if spec["entropy"] else "ref_log_prob") if spec["forward_only"] else "update_actor"
    inp = StageInputs(spec["tokens"], spec["micro_batches"], recompute, entropy=spec["entropy"])
    return stage_phase(_model(spec), _layout(spec), spec["stage"], phase, inp, Residency(need_ref=False))


@pytest.fixture(scope="module")
def traced():
    if not (ORACLE / "megatron" / "core").is_dir():
        pytest.skip(f"megatron-core 0.16.1 oracle not installed at {ORACLE}")
    specs = []
    for s in GRID:
        keys = ("tp", "pp", "vpp", "cp", "dp", "ep", "etp", "stage", "tokens", "micro_batches", "forward_only")
        model = {**asdict(model_shape(s["name"])), "num_hidden_layers": s["layers"]}
        specs.append({"model": model, **{k: s[k] for k in keys}, "entropy": s["entropy"], "recompute": s["recompute"]})
    cmd = [sys.executable, "-m", "labkit.model.trace_megatron"]
    proc = subprocess.run(cmd, input=json.dumps(specs), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index", range(len(GRID)), ids=lambda i: f"{GRID[i]['name']}-s{GRID[i]['stage']}-{i}")
def test_formula_matches_megatron_core_trace(traced, index):
    """Model states exactly as megatron-core's DDP buffers hold them; the pass's peak above them within 10%."""
    spec, got = GRID[index], traced[index]
    assert "error" not in got, got.get("error")
    phase = _formula(spec)
    live = phase.instants[phase.peak_instant]
    assert live["bf16_params"] == 2 * got["params"]
    if not spec["forward_only"]:
        assert live["fp32_main_grads"] == got["grad_buffer"]
        assert live["optimizer_states"] == got["optimizer"]
    activations = sum(v for k, v in live.items() if k not in STATES)
    assert 0.9 <= activations / got["peak_bytes"] <= 1.1, (activations, got["peak_bytes"], got["op"], got["alive"][:6])


def test_stage_params_sum_to_the_model():
    """TP = 1: the stages' parameters add up to the checkpoint (a tied head once more per extra copy, the
    router's score-correction bias being a buffer in megatron-core)."""
    checked = 0
    for name in model_names():
        m = model_shape(name)
        if m.mla or m.linear_attention or m.vision:
            continue
        moe_layers = m.num_moe_layers
        scored = moe_layers - (m.moe.hash_layers if m.moe is not None else 0)  # DeepSeek-V4's hashed layers: none
        buffers = scored * m.moe.num_experts if m.moe is not None and m.moe.router_score_bias else 0
        for pp in (1, 2):
            if m.num_hidden_layers % pp:
                continue
            layout = ParallelLayout("megatron", pp, pp=pp)
            total = sum(stage_params(m, layout, s)[0] for s in range(pp))
            copy = m.embedding_param_count() if m.tie_word_embeddings and pp > 1 else 0
            assert total == m.param_count() - buffers + copy, name
            checked += 1
    assert checked > 20


def test_expert_params_split_over_ep_and_etp():
    m = model_shape("Qwen3-30B-A3B")
    one = ParallelLayout("megatron", 1)
    split = ParallelLayout("megatron", 16, ep=8, etp=2)
    assert stage_params(m, split, 0)[1] * 16 == stage_params(m, one, 0)[1]


def test_optimizer_shards_over_dp_cp_and_experts_over_expert_dp():
    m = model_shape("Qwen3-30B-A3B")
    base = dict(tp=2, pp=2, ep=4, etp=1, sequence_parallel=True, use_distributed_optimizer=True)
    small, big = ParallelLayout("megatron", 16, **base), ParallelLayout("megatron", 32, cp=2, **base)
    a, b = model_states(m, small, 0), model_states(m, big, 0)
    assert (a["params"], a["grads"]) == (b["params"], b["grads"])
    phi, experts = stage_params(m, small, 0)
    assert a["optimizer"] == 12 * (phi - experts) // 4 + 12 * experts // 2
    assert b["optimizer"] == 12 * (phi - experts) // 8 + 12 * experts // 4  # DP·CP 4 -> 8, expert DP 2 -> 4
    plain = model_states(m, replace(small, use_distributed_optimizer=False), 0)
    assert plain["params"] + plain["grads"] + plain["optimizer"] == 18 * phi


def test_first_stage_holds_more_activations_than_the_last_under_1f1b():
    m = model_shape("Qwen2.5-7B")
    layout = ParallelLayout("megatron", 8, tp=2, pp=4, sequence_parallel=True)
    inp = StageInputs(8192, 8)
    saved = [stage_activations(m, layout, s, inp)["saved_layer_activations"] for s in range(4)]
    assert saved == sorted(saved, reverse=True) and saved[0] == 4 * saved[3]


@pytest.mark.parametrize("pp,vpp,mb", [(1, None, 3), (4, None, 8), (4, None, 2), (2, 2, 4), (4, 2, 8), (4, 3, 12)])
def test_in_flight_matches_the_schedule(pp, vpp, mb):
    layout = ParallelLayout("megatron", pp, pp=pp, vpp=vpp)
    schedule = pipeline_schedule(pp, vpp, mb)
    assert [in_flight(layout, s, mb) for s in range(pp)] == [max(s.peak_in_flight, 1) for s in schedule.stages]


def test_offload_moves_states_off_the_gpu_outside_their_phase():
    m, layout = model_shape("Qwen2.5-7B"), ParallelLayout("megatron", 8, tp=2, pp=2, use_distributed_optimizer=True)
    inp = StageInputs(4096, 4)
    off = Residency(param_offload=True, optimizer_offload=True)
    ref = stage_phase(m, layout, 0, "ref_log_prob", inp, off).instants["layer_forward"]
    assert ref["bf16_params"] == ref["fp32_main_grads"] == ref["optimizer_states"] == 0 and ref["ref_bf16_params"]
    old = stage_phase(m, layout, 0, "old_log_prob", inp, off).instants["layer_forward"]
    assert old["bf16_params"] and old["fp32_main_grads"] == old["optimizer_states"] == 0 and not old["ref_bf16_params"]
    upd = stage_phase(m, layout, 0, "update_actor", inp, off).instants["layer_backward"]
    assert upd["bf16_params"] and upd["fp32_main_grads"] and upd["optimizer_states"]
    kept = stage_phase(m, layout, 0, "ref_log_prob", inp).instants["layer_forward"]
    assert kept["fp32_main_grads"] == 2 * kept["bf16_params"] and kept["optimizer_states"]


def test_recompute_lowers_the_update_peak():
    m, layout = model_shape("Qwen3-8B"), ParallelLayout("megatron", 8, tp=2, pp=2, sequence_parallel=True)
    peaks = [
        stage_phase(m, layout, 0, "update_actor", StageInputs(16384, 4, rc)).peak_bytes
        for rc in (Recompute(), Recompute("selective", modules=("core_attn", "mlp")), Recompute("full", "uniform", 1))
    ]
    assert peaks[0] > peaks[1] > peaks[2]


def test_every_term_is_named_and_documented():
    m = model_shape("Qwen1.5-MoE-A2.7B")
    layout = ParallelLayout("megatron", 16, tp=2, pp=2, cp=2, ep=2, etp=1, sequence_parallel=True)
    passes = {p: StageInputs(8192, 4, Recompute("full", "block", 2), entropy=True) for p in PHASES}
    mem = megatron_memory(m, layout, passes, Residency(need_critic=True), gpu_bytes=80 * 2**30)
    used = {k for by in mem.phases.values() for p in by.values() for inst in p.instants.values() for k in inst}
    assert used <= set(MEGATRON_TERMS) and len(used) > 15
    with open(ORACLE.parents[1] / "docs" / "megatron.md") as f:
        assert megatron_terms_markdown() in f.read()


def test_verdict_names_the_highest_stage_and_phase():
    m, layout = model_shape("Qwen2.5-7B"), ParallelLayout("megatron", 8, tp=2, pp=4, sequence_parallel=True)
    passes = {"old_log_prob": StageInputs(16384, 8), "update_actor": StageInputs(16384, 8)}
    mem = megatron_memory(m, layout, passes, gpu_bytes=10 * 2**30)
    stage, phase, peak = mem.peak
    assert peak == max(mem.stage_peaks()) == mem.phases[stage][phase].peak_bytes
    assert mem.fits is False and megatron_memory(m, layout, passes, gpu_bytes=peak).fits is True


@pytest.mark.parametrize(
    "call,text",
    [
        (lambda m, lay: stage_phase(m, lay, 0, "generate", StageInputs(1, 1)), "phase must be one of"),
        (lambda m, lay: stage_phase(m, lay, 4, "update_actor", StageInputs(1, 1)), "stage must be in 0..1"),
        (lambda m, lay: stage_phase(m, replace(lay, tp=8), 0, "update_actor", StageInputs(1, 1)), "must divide"),
        (lambda m, lay: stage_phase(m, replace(lay, pp=5), 0, "update_actor", StageInputs(1, 1)), "divisible"),
        (lambda m, lay: stage_phase(m, lay, 0, "update_actor", StageInputs(1, 1, Recompute("full"))), "needs"),
        (
            lambda m, lay: stage_phase(m, replace(lay, sequence_parallel=True), 0, "old_log_prob", StageInputs(3, 1)),
            "TP",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(call, text):
    with pytest.raises(ValueError, match=text):
        call(model_shape("Qwen2.5-7B"), ParallelLayout("megatron", 4, tp=2, pp=2))


def test_one_call_is_fast():
    """Every stage × phase of a 94-layer MoE in well under 5 ms, each call with new tokens (no cache hits)."""
    m = model_shape("Qwen3-235B-A22B")
    layout = ParallelLayout("megatron", 256, tp=4, pp=2, cp=2, ep=16, etp=1, sequence_parallel=True)
    start = time.perf_counter()
    for i in range(20):
        passes = {p: StageInputs(16384 + 4 * i, 16) for p in ("old_log_prob", "ref_log_prob", "update_actor")}
        megatron_memory(m, layout, passes)
    assert (time.perf_counter() - start) / 20 < 0.005
