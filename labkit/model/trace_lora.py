"""LoRA adapters on a traced model (``labkit.model.memory_trace``), as verl's FSDP actor carries them: PEFT's
``get_peft_model`` (``verl/workers/engine/fsdp/transformer_impl.py: _build_lora_module``, lora_dropout 0, bias
none) after ``enable_input_require_grads``, the base frozen; the reference pass runs with the adapters disabled.

PEFT is not in labkit's venv, so the adapters are this module's own, with PEFT's shapes and forward
(``peft/tuners/lora/layer.py: Linear.forward``: ``base(x) + lora_B(lora_A(x)) * scaling``). The targets follow
``labkit.memory.lora`` (transformers 4.x names, PEFT's suffix rule, ``all-linear`` every linear of a decoder layer):
transformers 5 keeps a MoE's experts as 3-D parameters and its router as a bare weight, so an adapted expert
linear gets one (A, B) pair per expert applied to its routed rows through grouped matrix products
(``integrations/moe.py: grouped_mm_experts_forward`` with the adapters added), the router one pair on its logits.
Adapters are in the compute dtype (FSDP's gathered copy); their fp32 masters, gradients and AdamW states are
counted after the pass by ``adapter_states`` (one FSDP rank holding them all).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from labkit.model.held_bytes import HeldBytes

ALPHA = 32  # verl's lora_alpha default; only the scaling, not a byte, depends on it
EXPERT_LINEARS = ("gate_proj", "up_proj", "down_proj")


def _wanted(name: str, targets: str | list[str]) -> bool:
    """PEFT's rule for a list (the full name or a suffix after a dot; ``{e}`` any expert, as ``labkit.memory.lora``
    writes it); ``all-linear`` every decoder linear."""
    if targets == "all-linear":
        return True
    return any(name == t or name.endswith("." + t) for t in (t.replace("{e}", "0") for t in targets))


class LoraLinear(nn.Module):
    """PEFT's ``lora.Linear`` around an ``nn.Linear``: A (r × in) and B (out × r), no dropout (verl sets none)."""

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base_layer = base
        kw = {"bias": False, "device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, **kw)
        self.lora_B = nn.Linear(rank, base.out_features, **kw)
        self.scaling = ALPHA / rank
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        if not self.enabled:  # PEFT's disable_adapter(): the base layer alone
            return result
        dtype = result.dtype
        result = result + self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scaling
        return result.to(dtype)


def _pair(n: int, fan_in: int, fan_out: int, rank: int, like: torch.Tensor) -> nn.ParameterList:
    """One (A, B) pair per expert, stacked: A (n, r, in), B (n, out, r)."""
    kw = {"device": like.device, "dtype": like.dtype}
    return nn.ParameterList([torch.empty(n, rank, fan_in, **kw), torch.empty(n, fan_out, rank, **kw)])


def _grouped_lora(x: torch.Tensor, pair: nn.ParameterList, offsets: torch.Tensor, scaling: float) -> torch.Tensor:
    from transformers.integrations.moe import _grouped_linear

    return _grouped_linear(_grouped_linear(x, pair[0], offsets), pair[1], offsets) * scaling


def _experts_forward(self: Any, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> Any:
    """transformers' ``grouped_mm_experts_forward`` (gated experts, no bias, no EP; its tensors' lifetimes: the routed
    copy and the experts' output kept to the end, ``proj_out`` replaced at each step) with each adapted expert
    linear's LoRA on its routed rows: what 4.x's per-expert ``nn.Linear`` adapters compute, grouped."""
    from transformers.integrations.moe import _grouped_linear

    k, tokens = top_k_index.size(-1), hidden.size(0)
    ids, perm = torch.sort(top_k_index.reshape(-1))
    x = hidden[perm // k]
    weights = top_k_weights.reshape(-1)[perm]
    histc_input = ids.float() if ids.device.type == "cpu" else ids.int()  # transformers' own choice by device
    counts = torch.histc(histc_input, self.num_experts, 0, self.num_experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    lora, s, on = self.lora_experts, self.lora_scaling, self.lora_enabled
    proj = _grouped_linear(x, self.gate_up_proj, offsets)
    gate, up = proj.chunk(2, dim=-1)
    if on and "gate_proj" in lora:
        gate = gate + _grouped_lora(x, lora["gate_proj"], offsets, s)
    if on and "up_proj" in lora:
        up = up + _grouped_lora(x, lora["up_proj"], offsets, s)
    proj = self.act_fn(gate) * up
    del gate, up
    out = _grouped_linear(proj, self.down_proj, offsets)
    if on and "down_proj" in lora:
        out = out + _grouped_lora(proj, lora["down_proj"], offsets, s)
    del proj
    weighted = out * weights.unsqueeze(-1)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.size(0), device=perm.device)
    weighted = weighted[inverse]
    return weighted.view(tokens, k, -1).sum(dim=1).to(hidden.dtype)


def _router_forward(self: Any, hidden: torch.Tensor) -> Any:
    """transformers' top-k router (``Qwen3MoeTopKRouter.forward``) with 4.x's ``mlp.gate`` adapter on its logits."""
    hidden = hidden.reshape(-1, self.hidden_dim)
    logits = F.linear(hidden, self.weight)
    if self.lora_enabled:
        a, b = self.lora_router
        logits = logits + F.linear(F.linear(hidden, a), b) * self.lora_scaling
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    top, indices = torch.topk(probs, self.top_k, dim=-1)
    if self.norm_topk_prob:
        top /= top.sum(dim=-1, keepdim=True)
    return logits, top.to(logits.dtype), indices


def _adapt_moe(block: nn.Module, prefix: str, rank: int, targets: str | list[str]) -> list[nn.Module]:
    """Adapters on a MoE block's router and routed experts where ``targets`` names them (4.x names)."""
    adapted = []
    experts, router = block.experts, block.gate
    chosen = [n for n in EXPERT_LINEARS if _wanted(f"{prefix}.experts.0.{n}", targets)]
    if chosen:
        e, h, i = experts.num_experts, experts.hidden_dim, experts.intermediate_dim
        shapes = {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        experts.lora_experts = nn.ModuleDict({n: _pair(e, *shapes[n], rank, experts.down_proj) for n in chosen})
        experts.forward = types.MethodType(_experts_forward, experts)
        adapted.append(experts)
    if _wanted(f"{prefix}.gate", targets) and hasattr(router, "top_k"):
        e, h = router.weight.shape
        kw = {"device": router.weight.device, "dtype": router.weight.dtype}
        router.lora_router = nn.ParameterList([torch.empty(rank, h, **kw), torch.empty(e, rank, **kw)])
        router.forward = types.MethodType(_router_forward, router)
        adapted.append(router)
    for module in adapted:
        module.lora_scaling, module.lora_enabled = ALPHA / rank, True
    return adapted


def add_adapters(model: nn.Module, lora: dict[str, Any], update: bool) -> None:
    """Put rank ``lora["rank"]`` adapters on the decoder layers' linears ``lora["targets"]`` names (a list of
    suffixes or ``all-linear``), enabled unless ``lora["enabled"]`` is False (the reference pass); freeze the base;
    for an update, the adapters train (each gradient dropped as it is made, as FSDP reduce-scatters it) and the
    input embeddings' output requires grad (``enable_input_require_grads``)."""
    rank, targets, enabled = int(lora["rank"]), lora.get("targets", "all-linear"), bool(lora.get("enabled", True))
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped: list[nn.Module] = []
    for name, module in list(model.named_modules()):
        if ".layers." not in f".{name}." or "visual" in name:
            continue
        if hasattr(module, "experts") and hasattr(module, "gate"):
            wrapped += _adapt_moe(module, name, rank, targets)
        for child, sub in list(module.named_children()):
            if isinstance(sub, nn.Linear) and _wanted(f"{name}.{child}", targets):
                setattr(module, child, LoraLinear(sub, rank))
                wrapped.append(getattr(module, child))
    for module in wrapped:
        if isinstance(module, LoraLinear):
            module.enabled = enabled
        else:
            module.lora_enabled = enabled
    for p in adapter_params(model):
        p.requires_grad_(update)
        if update:
            p.register_post_accumulate_grad_hook(lambda q: setattr(q, "grad", None))
    if update:
        model.enable_input_require_grads()


def adapter_params(model: nn.Module) -> list[nn.Parameter]:
    """The adapters' parameters (every parameter whose name holds ``lora_``)."""
    return [p for n, p in model.named_parameters() if "lora_" in n]


def adapter_states(model: nn.Module) -> dict[str, int]:
    """The adapters' model states as one FSDP rank holds them all: fp32 masters (verl builds the actor in fp32), their
    gradients and one step of torch's AdamW (``fused``: the step count needs no ``.item()`` on a fake tensor)."""
    params = adapter_params(model)
    held = HeldBytes()
    with held:
        masters = [torch.zeros_like(p, dtype=torch.float32) for p in params]
        for m in masters:
            m.grad = torch.zeros_like(m)
        optimizer = torch.optim.AdamW(masters, lr=1e-6, fused=True)
        optimizer.step()
    total = held.held()
    del optimizer, masters
    return {"adapter_params": sum(p.numel() for p in params), "adapter_state_bytes": total}
