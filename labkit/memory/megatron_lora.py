"""LoRA as verl trains it on Megatron: Megatron-Bridge's PEFT over megatron-core's fused modules
(``verl/workers/config/megatron_peft.py: get_peft_cls`` → ``megatron.bridge.peft.utils.create_peft``), the base
frozen, the reference the actor with its adapters off (``ray_trainer.py``: ``ref_in_actor`` when ``lora.rank`` > 0).

verl's ``model.lora.target_modules`` names megatron-core's modules (``linear_qkv``, ``linear_proj``, ``linear_fc1``,
``linear_fc2`` by default; canonical LoRA's ``linear_q``/``linear_k``/``linear_v``/``linear_fc1_up``/
``linear_fc1_gate``; ``router``). ``MEGATRON_TO_HF`` reads them as the Hugging Face linears they fuse, so one
``labkit.memory.lora.LoraSpec`` says what is adapted for the rollout's vLLM slots and here. On a training rank an
adapter is a pair of tensor-parallel linears (in → r, r → out) split over TP like its base (over ETP for a routed
expert; the router's whole): r·(in + out)/TP parameters per fused module, the q/k/v (and gate/up) adapters of one
layer sharing one A. Approximated: the adapters' own activations (r values a token per adapted module, under 1% of
a layer's saved activations) are not priced, and the layers' saved activations are the full model's (what a frozen
base saves less is not modelled: an over-estimate).
"""

from __future__ import annotations

from labkit.memory.lora import LoraSpec, target_pattern
from labkit.memory.megatron_stages import stage_layers
from labkit.memory.shapes import ModelShape
from labkit.rules.parallel_layout import ParallelLayout

MEGATRON_DEFAULT_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
"""verl 0.9.1's ``model.lora.target_modules`` default (``trainer/config/model/hf_model.yaml``)."""

MEGATRON_TO_HF = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_q": ("q_proj",),
    "linear_k": ("k_proj",),
    "linear_v": ("v_proj",),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc1_gate": ("gate_proj",),
    "linear_fc1_up": ("up_proj",),
    "linear_fc2": ("down_proj",),
    "router": ("gate",),
}
"""megatron-core's module names in verl's ``target_modules`` → the Hugging Face linears each fuses."""

_FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "proj", "gate_proj": "fc1", "up_proj": "fc1"}


def hf_targets(targets: object) -> object:
    """``target_modules`` with megatron-core's names read as the Hugging Face linears they fuse (other entries and a
    regular expression kept as they are; LoraError as ``labkit.memory.lora.target_pattern``)."""
    targets = target_pattern(targets, "target_modules")
    if not isinstance(targets, tuple):
        return targets
    out: list[str] = []
    for name in targets:
        out.extend(MEGATRON_TO_HF.get(name, (name,)))
    return tuple(dict.fromkeys(out))


def _module(name: str) -> tuple[str, str]:
    """(where: dense / experts / shared, fused module) of a Hugging Face linear's name."""
    where = "experts" if ".experts." in name else "shared" if "shared_expert" in name else "dense"
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "gate" or leaf == "shared_expert_gate":
        return where, leaf
    return where, _FUSED.get(leaf, "fc2" if leaf == "down_proj" else leaf)


def layer_adapters(m: ModelShape, spec: LoraSpec, index: int, layout: ParallelLayout) -> tuple[int, int]:
    """One decoder layer's adapter parameters on a rank: (all, routed experts' share)."""
    fused: dict[tuple[str, str], list] = {}
    for lin in spec.targets[index]:
        fused.setdefault(_module(lin.name), []).append(lin)
    total = experts = 0
    r = spec.rank
    for (where, module), lins in fused.items():
        fan_in = lins[0].fan_in
        fan_out = sum(x.fan_out for x in lins)
        if module in ("gate", "shared_expert_gate"):  # the router (and a shared expert's gate): replicated
            total += r * (fan_in + fan_out)
        elif where == "experts":
            local = lins[0].count // max(layout.ep, 1)
            part = local * r * (fan_in + fan_out) // max(layout.etp, 1)
            total, experts = total + part, experts + part
        else:
            total += r * (fan_in + fan_out) // max(layout.tp, 1)
    return total, experts


def stage_adapters(m: ModelShape, spec: LoraSpec, layout: ParallelLayout, stage: int) -> tuple[int, int]:
    """The adapters of ``stage``'s layers on one rank: (all, routed experts' share)."""
    total = experts = 0
    for chunk in stage_layers(m, layout, stage):
        for index in chunk:
            a, e = layer_adapters(m, spec, index, layout)
            total, experts = total + a, experts + e
    return total, experts
