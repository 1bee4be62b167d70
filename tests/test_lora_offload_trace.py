"""LoRA on FSDP and Megatron's CPU optimizer offload against fake-CUDA traces.

LoRA: the Hugging Face decoder traced with PEFT-shaped adapters on a frozen base (labkit.model.trace_lora; the
reference pass with them disabled), beside labkit's phase for the same model, cut to a few decoder layers (each
layer of these models has one shape): the pass's own bytes within 10%, and the adapters' count and model states
(fp32 masters, gradients, AdamW) as the formula counts them. Megatron: megatron-core 0.16.1's own optimizer
(DistributedOptimizer, HybridDeviceOptimizer with optimizer_offload_fraction) built over a traced stage and stepped
once, the bytes it then holds on the GPU beside labkit's optimizer_states read from the same config."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace

import pytest

from labkit.config.verl_config import load_config
from labkit.memory.choice import settings_for
from labkit.memory.lora import lora_spec
from labkit.memory.megatron_params import model_states
from labkit.memory.megatron_step import optimizer_of
from labkit.memory.model_catalogue import model_shape
from labkit.memory.phase_records import PassShape
from labkit.memory.phases import forward_pass, update_pass
from labkit.memory.trace_compare import trace_spec, transient_terms
from labkit.model.trace_megatron import ORACLE
from labkit.model.trace_runner import run_traces
from labkit.rules.parallel_layout import ParallelLayout

DENSE, MOE, SHARED = "Qwen2.5-7B", "Qwen3-30B-A3B", "Qwen1.5-MoE-A2.7B"
LAYERS = {DENSE: 4, MOE: 2, SHARED: 2}
"""Decoder layers traced and priced."""
QV = ("q_proj", "v_proj")
ALL = "all-linear"
NO_CKPT = {"gradient_checkpointing": False}  # every layer's saved tensors: what a frozen base keeps
FUSED = {"fused_kernels": True}  # the head a chunk at a time: the layers' own working sets set the peak
# (model, tokens, pass, rank, targets, settings changes)
LORA_GRID = [
    (DENSE, 8192, "update_actor", 64, ALL, {}),  # checkpointed: the logits and the frozen LM head's backward
    (DENSE, 8192, "update_actor", 64, ALL, NO_CKPT),
    (DENSE, 8192, "update_actor", 8, QV, NO_CKPT),  # the MLP's inputs and down_proj's no longer saved
    (DENSE, 16384, "update_actor", 8, QV, FUSED),  # the recomputed layer's MLP backward
    (DENSE, 16384, "update_actor", 64, ALL, FUSED),
    (DENSE, 16384, "old_log_prob", 64, ALL, FUSED),  # up_proj's adapter beside the MLP's forward
    (DENSE, 16384, "old_log_prob", 8, QV, FUSED),
    (DENSE, 8192, "old_log_prob", 8, QV, {}),  # the logits and the entropy
    (DENSE, 16384, "ref_log_prob", 64, ALL, FUSED),  # the adapters disabled
    (MOE, 8192, "update_actor", 64, ALL, NO_CKPT),  # every expert adapted: A outputs on k·T routed rows
    (MOE, 8192, "update_actor", 8, ALL, NO_CKPT),
    (MOE, 8192, "update_actor", 8, ("up_proj",), NO_CKPT),
    (MOE, 16384, "update_actor", 64, ALL, FUSED),  # the routed backward of the recomputed layer
    (MOE, 16384, "update_actor", 8, QV, FUSED),
    (MOE, 16384, "old_log_prob", 64, ALL, FUSED),
    (MOE, 16384, "ref_log_prob", 8, ALL, FUSED),
    (SHARED, 8192, "update_actor", 64, ALL, NO_CKPT),  # the shared expert's linears and its Linear(H, 1) gate
    (SHARED, 16384, "update_actor", 8, ("gate", "down_proj"), FUSED),  # the router's adapter; down_proj's
]


def _lora_id(case: int) -> str:
    model, tokens, name, rank, targets, changes = LORA_GRID[case]
    what = targets if isinstance(targets, str) else "+".join(targets)
    return f"{model}-{name}-{tokens}-r{rank}-{what}-{'-'.join(changes) or 'default'}"


def _lora_case(case: int):
    """The settings (one FSDP rank, the model cut to LAYERS), the pass name and labkit's phase."""
    model, tokens, name, rank, targets, changes = LORA_GRID[case]
    s = settings_for(load_config(None, []), model)
    m = replace(s.model, num_hidden_layers=LAYERS[model])
    s = replace(s, model=m, lora=lora_spec(m, rank, targets), fsdp_size=1, **changes)
    fn = update_pass if name.startswith("update") else forward_pass
    return s, name, fn(s, name, PassShape(2, tokens))


@pytest.fixture(scope="module")
def lora_traced():
    return run_traces([trace_spec(*_lora_case(k)) for k in range(len(LORA_GRID))])


@pytest.mark.parametrize("case", range(len(LORA_GRID)), ids=_lora_id)
def test_lora_pass_within_10_percent_of_the_trace(lora_traced, case):
    s, name, phase = _lora_case(case)
    spec = trace_spec(s, name, phase)
    assert spec["lora"]["rank"] == s.lora.rank and spec["lora"]["enabled"] == (name != "ref_log_prob")
    formula = sum(transient_terms(phase).values())
    got = lora_traced[case]
    detail = (LORA_GRID[case], formula / 2**30, got["peak_bytes"] / 2**30, got["op"], got["module"], got["alive"][:6])
    assert 0.9 <= formula / got["peak_bytes"] <= 1.1, detail


FULL_GRID = [
    (DENSE, 16384, FUSED),
    (DENSE, 16384, {**FUSED, **NO_CKPT}),
    (MOE, 16384, FUSED),  # the recomputed layer's routed backward: its un-sort's gradients (moe_unsort_grads)
    (SHARED, 16384, FUSED),
]
"""Models trained in full, where the recomputed layer's backward sets the peak: the dense MLP's gradients (the same
the LoRA cases showed: labkit.memory.phases._mlp_grads), a MoE block's un-sort (term_bytes.moe_unsort_grad_bytes)."""


def _full_case(case: int):
    model, tokens, changes = FULL_GRID[case]
    s = settings_for(load_config(None, []), model)
    s = replace(s, model=replace(s.model, num_hidden_layers=LAYERS[model]), fsdp_size=1, **changes)
    return s, "update_actor", update_pass(s, "update_actor", PassShape(2, tokens))


def test_full_fine_tune_update_within_10_percent_of_the_trace():
    traced = run_traces([trace_spec(*_full_case(k)) for k in range(len(FULL_GRID))])
    for case, got in enumerate(traced):
        formula = sum(transient_terms(_full_case(case)[2]).values())
        assert 0.9 <= formula / got["peak_bytes"] <= 1.1, (FULL_GRID[case], formula / 2**30, got["peak_bytes"] / 2**30)


def test_lora_adapters_and_their_model_states_as_the_formula_counts(lora_traced):
    """The adapters PEFT's shapes give each linear (a routed expert's per expert, the router's) are the formula's
    count; one rank's fp32 masters, gradients and AdamW states after a step are its params/grads/optimizer share."""
    checked = 0
    for case, (_, _, name, *_) in enumerate(LORA_GRID):
        if name != "update_actor":
            continue
        s, _, phase = _lora_case(case)
        got = lora_traced[case]["adapters"]
        assert got["adapter_params"] == s.lora.params, LORA_GRID[case]
        step = phase.instants["optimizer_step"]
        formula = step["grads"] + step["optimizer"] + s.master_bytes * s.lora.params
        assert 0.99 <= formula / got["adapter_state_bytes"] <= 1.01, (LORA_GRID[case], formula, got)
        checked += 1
    assert checked >= 8


def test_an_adapted_expert_saves_its_routed_rows_not_every_expert(lora_traced):
    """A routed expert's adapter runs on its own tokens: a MoE layer's adapters save r-wide A outputs on
    4 + 1 + 3k rows a token (attention, router, k experts' gate/up/down), not 4 + 1 + 3E (128 experts, top-8).
    Traced: rank 64 against rank 8 on every linear, every layer's saved tensors."""
    ranks = {LORA_GRID[c][3]: c for c in range(len(LORA_GRID)) if LORA_GRID[c][:3] == (MOE, 8192, "update_actor")
             and LORA_GRID[c][4:] == (ALL, NO_CKPT)}  # fmt: skip
    m = _lora_case(ranks[64])[0].model
    rows = 4 + 1 + 3 * m.moe.num_experts_per_tok
    formula = m.num_hidden_layers * 8192 * 2 * (64 - 8) * rows
    traced = lora_traced[ranks[64]]["peak_bytes"] - lora_traced[ranks[8]]["peak_bytes"]
    assert 0.9 <= formula / traced <= 1.1, (formula, traced)
    assert lora_spec(m, 64, ALL).adapters_per_layer == 4 + 1 + 3 * m.moe.num_experts  # what the answer shows


# Megatron: megatron-core's optimizer on one stage (model, layers, layout, stage, override_optimizer_config)
OFFLOAD = "optimizer_cpu_offload"
FRACTION = "optimizer_offload_fraction"
DENSE_LAYOUT = {"tp": 2, "pp": 1, "dp": 2, "ep": 1, "etp": None}
MOE_LAYOUT = {"tp": 1, "pp": 4, "dp": 16, "ep": 16, "etp": 1}  # a middle stage: its layers only
MEGATRON_GRID = [
    (DENSE, 28, DENSE_LAYOUT, 0, {}),  # no offload: 12 bytes a shard element
    (DENSE, 28, DENSE_LAYOUT, 0, {OFFLOAD: True, FRACTION: 0.0}),
    (DENSE, 28, DENSE_LAYOUT, 0, {OFFLOAD: True, FRACTION: 0.5}),
    (DENSE, 28, DENSE_LAYOUT, 0, {OFFLOAD: True, FRACTION: 1.0}),  # the fp32 main shards stay on the GPU
    (
        DENSE,
        28,
        DENSE_LAYOUT,
        0,
        {
            OFFLOAD: True,
            FRACTION: 0.5,
            "use_precision_aware_optimizer": True,
            "exp_avg_dtype": "bf16",
            "exp_avg_sq_dtype": "bf16",
        },
    ),  # fmt: skip
    (DENSE, 28, DENSE_LAYOUT, 0, {OFFLOAD: True, FRACTION: 1.0, "use_precision_aware_optimizer": True}),
]
MOE_MEGATRON_GRID = [(MOE, 8, MOE_LAYOUT, 1, {OFFLOAD: True, FRACTION: f}) for f in (0.0, 0.5, 1.0)]
OWN_KEYS = ("use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype")
"""verl 0.9.1's McoreOptimizerConfig keys of its own (the rest go through override_optimizer_config)."""


def _megatron_layout(layout: dict) -> ParallelLayout:
    world = layout["tp"] * layout["pp"] * layout["dp"]
    return ParallelLayout(
        "megatron", world, tp=layout["tp"], pp=layout["pp"], ep=layout["ep"], etp=layout["etp"] or layout["tp"],
        sequence_parallel=layout["tp"] > 1, use_distributed_optimizer=True,
    )  # fmt: skip


def _megatron_formula(case) -> int:
    """labkit's optimizer_states on the stage, the optimizer read from the config as verl's keys carry it."""
    model, layers, layout, stage, options = case
    optim = "actor_rollout_ref.actor.optim"
    keys = [
        f"{optim}.{k}={v}" if k in OWN_KEYS else f"+{optim}.override_optimizer_config.{k}={v}"
        for k, v in options.items()
    ]
    opt = optimizer_of(load_config(None, keys), "actor_rollout_ref.actor")
    m = replace(model_shape(model), num_hidden_layers=layers)
    return model_states(m, _megatron_layout(layout), stage, opt=opt)["optimizer"]


def _megatron_traces(grid) -> list[dict]:
    if not (ORACLE / "megatron" / "core").is_dir():
        pytest.skip(f"megatron-core 0.16.1 oracle not installed at {ORACLE}")
    specs = []
    for model, layers, layout, stage, options in grid:
        shape = {**asdict(model_shape(model)), "num_hidden_layers": layers}
        specs.append({"model": shape, **layout, "cp": 1, "vpp": None, "stage": stage, "tokens": 128,
                      "micro_batches": 0, "forward_only": False, "optimizer": options})  # fmt: skip
    cmd = [sys.executable, "-m", "labkit.model.trace_megatron"]
    proc = subprocess.run(cmd, input=json.dumps(specs), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_gpu_optimizer(case, got) -> None:
    assert "error" not in got, got.get("error")
    formula, traced = _megatron_formula(case), got["optimizer_gpu"]
    assert abs(formula - traced) <= 0.1 * traced + 2**20, (case, formula / 2**30, traced / 2**30)


@pytest.fixture(scope="module")
def megatron_traced():
    return _megatron_traces(MEGATRON_GRID)


def _megatron_id(case: int) -> str:
    options = MEGATRON_GRID[case][4]
    what = f"offload-{options[FRACTION]}" if options.get(OFFLOAD) else "on-gpu"
    return what + ("-precision-aware" if options.get("use_precision_aware_optimizer") else "")


@pytest.mark.parametrize("case", range(len(MEGATRON_GRID)), ids=_megatron_id)
def test_megatron_optimizer_on_the_gpu_within_10_percent(megatron_traced, case):
    _assert_gpu_optimizer(MEGATRON_GRID[case], megatron_traced[case])


def test_megatron_offload_moves_the_states_and_leaves_the_main_shards(megatron_traced):
    """Fraction 1 without the precision-aware optimizer: the DistributedOptimizer's fp32 main shards stay on the
    GPU (4 of the 12 bytes); with it the hybrid optimizer keeps nothing there. What leaves goes to the CPU with a
    gradient copy (16 bytes an element there)."""
    kept, none = megatron_traced[3], megatron_traced[5]
    full = megatron_traced[0]["optimizer_gpu"]
    assert abs(kept["optimizer_gpu"] / full - 1 / 3) < 0.01 and none["optimizer_gpu"] < 2**20
    assert abs(kept["optimizer_cpu"] / full - 16 / 12) < 0.01


@pytest.mark.slow
def test_megatron_moe_stage_optimizer_on_the_gpu_within_10_percent():
    """Qwen3-30B-A3B's middle pipeline stage at EP 16 (8 local experts a layer: the expert optimizer and the dense
    one each offload their fraction)."""
    for case, got in zip(MOE_MEGATRON_GRID, _megatron_traces(MOE_MEGATRON_GRID)):
        _assert_gpu_optimizer(case, got)
