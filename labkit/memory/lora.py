"""LoRA as verl trains it on FSDP: PEFT's ``get_peft_model`` over the actor (``fsdp_workers.py:
_build_model_optimizer``; the engine's ``_build_module`` from 0.8), rank r adapters on the linears ``target_modules``
names (PEFT's rules: ``all-linear`` is every ``nn.Linear`` but the output layer; a list matches module-name
suffixes, a string is a regular expression over the full name), the base frozen.

An adapter on a linear (in → out) holds r·(in + out) parameters. Only the adapters train: their gradients and Adam
states are the only ones, the LM head (never adapted by ``all-linear``) makes no weight gradient, and the reference
policy is the actor with its adapters disabled (``ref_in_actor``: no second model). The rollout gets the adapter as
a vLLM LoRA (``enable_lora``, ``max_loras=1``, ``max_lora_rank`` the next rank vLLM allows): vLLM holds an A and a B
slot for every linear it supports (``vllm_rollout/utils.py: get_vllm_max_lora_rank``).

The module names follow transformers 4.x, what verl's users ran in 2025: a MoE's experts are ``nn.Linear`` each
(``mlp.experts.N.gate_proj``), so ``all-linear`` adapts every expert and the router (``mlp.gate``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from labkit.config.messages import InputError
from labkit.memory.shapes import ModelShape
from labkit.memory.term_bytes import moe_unsort_grad_bytes

VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's ``MaxLoRARanks`` (verl's fallback list when vLLM does not export it)."""


class LoraError(InputError):
    """A LoRA setting verl or PEFT would refuse (a rank below 1, a target no module has)."""


@dataclass(frozen=True)
class Linear:
    """One linear of a decoder layer: its full name's suffix, input and output widths, how many (experts)."""

    name: str
    fan_in: int
    fan_out: int
    count: int = 1


@dataclass(frozen=True)
class LoraSpec:
    """What LoRA adapts in one model: the rank and, per decoder layer, the adapted linears."""

    rank: int
    targets: tuple[tuple[Linear, ...], ...]
    """Per decoder layer, the linears that carry an adapter."""
    rollout_rank: int
    """vLLM's ``max_lora_rank``: the first allowed rank at least ``rank`` (0: merged into the weights)."""

    @property
    def layer_params(self) -> tuple[int, ...]:
        """Adapter parameters per decoder layer: r·(in + out) per adapted linear."""
        return tuple(sum(self.rank * (x.fan_in + x.fan_out) * x.count for x in layer) for layer in self.targets)

    @property
    def params(self) -> int:
        """Every adapter parameter (what trains, what has gradients and Adam states)."""
        return sum(self.layer_params)

    @property
    def adapters_per_layer(self) -> int:
        """Adapted linears in the largest layer (each saves an r-wide activation under grad)."""
        return max((sum(x.count for x in layer) for layer in self.targets), default=0)


def _dense(m: ModelShape) -> list[Linear]:
    h, i = m.hidden_size, m.intermediate_size
    mlp = [Linear("mlp.gate_proj", h, i), Linear("mlp.up_proj", h, i)] if m.gated_mlp else [Linear("mlp.up_proj", h, i)]
    return [*mlp, Linear("mlp.down_proj", i, h)]


def layer_linears(m: ModelShape, index: int) -> list[Linear]:
    """Layer ``index``'s ``nn.Linear`` modules (transformers 4.x names); LoraError for mixers PEFT names otherwise
    (MLA, linear attention, Mamba2, compressed attention), which labkit does not price."""
    if m.mla is not None or m.linear_attention is not None or m.mamba is not None or m.compressed_attention is not None:
        raise LoraError(
            f"LoRA on {m.name}'s attention (MLA, linear attention or Mamba2 blocks) is not priced: labkit prices "
            "adapters on q/k/v/o attention and gated MLPs"
        )
    h, hd = m.hidden_size, m.head_dim
    q, kv = m.num_attention_heads * hd, m.num_key_value_heads * hd
    q_out = 2 * q if m.attention_output_gate else q
    out = [
        Linear("self_attn.q_proj", h, q_out),
        Linear("self_attn.k_proj", h, kv),
        Linear("self_attn.v_proj", h, kv),
        Linear("self_attn.o_proj", q, h),
    ]
    if not m.is_moe_layer(index):
        return out + _dense(m)
    moe = m.moe
    assert moe is not None
    ie = moe.moe_intermediate_size
    experts = [
        Linear("mlp.experts.{e}.up_proj", h, ie, moe.num_experts),
        Linear("mlp.experts.{e}.down_proj", ie, h, moe.num_experts),
    ]
    if moe.gated:
        experts.insert(0, Linear("mlp.experts.{e}.gate_proj", h, ie, moe.num_experts))
    out += [Linear("mlp.gate", h, moe.num_experts), *experts]
    if moe.shared_expert_intermediate_size:
        s = moe.shared_expert_intermediate_size
        out += [Linear("mlp.shared_expert.gate_proj", h, s), Linear("mlp.shared_expert.up_proj", h, s)]
        out += [Linear("mlp.shared_expert.down_proj", s, h)]
        if moe.shared_expert_gate:
            out.append(Linear("mlp.shared_expert_gate", h, 1))
    return out


def _matches(name: str, pattern: str | tuple[str, ...]) -> bool:
    """PEFT's rule: a string is a regular expression over the full name; a list matches the name or its suffix."""
    full = f"model.layers.0.{name.replace('{e}', '0')}"
    if isinstance(pattern, str):
        return re.fullmatch(pattern, full) is not None
    return any(full == t or full.endswith("." + t) for t in pattern)


def target_pattern(value: object, key: str) -> str | tuple[str, ...] | None:
    """``target_modules`` / ``exclude_modules`` as PEFT reads them: a list (also as an override's ``[a,b]`` text), a
    regular expression, or None; LoraError for anything else."""
    if value is None or value == "null":
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            return tuple(t.strip().strip("'\"") for t in text[1:-1].split(",") if t.strip())
        return text
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise LoraError(f"'{key}' is {value!r}; PEFT takes a module name, a list of names or a regular expression")


@cache
def lora_spec(
    m: ModelShape, rank: int, target_modules: object = "all-linear", exclude_modules: object = None, merge: bool = False
) -> LoraSpec:
    """The adapters ``rank``, ``target_modules`` and ``exclude_modules`` put on ``m`` (LoraError as verl or PEFT
    would refuse them). ``merge``: verl merges the adapter into the weights it syncs (no vLLM LoRA)."""
    if rank < 1:
        raise LoraError(f"lora_rank must be greater than 0, get {rank}")  # verl: get_vllm_max_lora_rank's words
    if rank > VLLM_MAX_LORA_RANKS[-1] and not merge:
        raise LoraError(f"lora_rank must be less than or equal to {VLLM_MAX_LORA_RANKS[-1]}, but got {rank}")
    targets = target_pattern(target_modules, "target_modules")
    exclude = target_pattern(exclude_modules, "exclude_modules")
    layers, hit = [], set()
    for index in range(m.num_hidden_layers):
        chosen = []
        for lin in layer_linears(m, index):
            wanted = targets == "all-linear" or (targets is not None and _matches(lin.name, targets))
            if wanted and not (exclude is not None and _matches(lin.name, exclude)):
                chosen.append(lin)
                hit.add(lin.name)
        layers.append(tuple(chosen))
    if not hit:
        shown = set(targets) if isinstance(targets, tuple) else targets  # PEFT keeps a list as a set
        raise LoraError(
            f"Target modules {shown} not found in the base model. Please check the target modules and try again."
        )  # PEFT's words (tuners_utils.py: inject_adapter)
    rollout = 0 if merge else next(r for r in VLLM_MAX_LORA_RANKS if r >= rank)
    return LoraSpec(rank, tuple(layers), rollout)


def vllm_lora_bytes(m: ModelShape, spec: LoraSpec, b: int, tp: int) -> int:
    """vLLM's LoRA slots (``max_loras=1`` at ``max_lora_rank``) for the attention and dense MLP linears of every
    layer, split over TP: allocated with the model at start-up, inside the engine's share (a MoE's routed experts
    get no slots here: vLLM's expert LoRA is not priced)."""
    if not spec.rollout_rank:
        return 0
    per_layer = [
        sum(
            spec.rollout_rank * (x.fan_in + x.fan_out)
            for x in layer_linears(m, i)
            if x.count == 1 and x.name != "mlp.gate"
        )
        for i in range(m.num_hidden_layers)
    ]
    return b * sum(per_layer) // tp


ATTENTION_INPUTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
MOE_INPUTS = ("mlp.gate", "mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj", "mlp.shared_expert.gate_proj",
              "mlp.shared_expert.up_proj", "mlp.shared_expert_gate")  # fmt: skip


def _rows(m: ModelShape, x: Linear) -> int:
    """Rows an adapter's A output has per token: a routed expert's linear runs on its tokens only, k·T over the
    experts of a layer (not E·T); every other linear on every token."""
    return m.moe.num_experts_per_tok if x.count > 1 and m.moe is not None else 1


def _layer_saved(m: ModelShape, index: int, spec: LoraSpec, tokens: int, b: int) -> int:
    """One decoder layer's saved tensors when only the adapters train (``lora_saved_layer_bytes``)."""
    names = {x.name for x in spec.targets[index]}
    h, hd, fp32 = m.hidden_size, m.head_dim, 4 if b < 4 else b
    q, kv = m.num_attention_heads * hd, m.num_key_value_heads * hd
    q_out = 2 * q if m.attention_output_gate else q
    per = 2 * fp32 * h + b * (q_out + q + 2 * kv)  # the norms' fp32 inputs; rotated q, k, v and the attention output
    per += fp32 * (q + kv) if m.qk_norm and b < 4 else 0  # Qwen3's q/k norms: their fp32 inputs only
    per += b * h if names & set(ATTENTION_INPUTS) else 0  # the normed input an adapter's A reads
    per += b * spec.rank * sum(_rows(m, x) for x in spec.targets[index])  # the adapters' A outputs
    if not m.is_moe_layer(index):
        i = m.intermediate_size
        up = "mlp.gate_proj" in names or "mlp.up_proj" in names
        return tokens * (per + b * h * up + b * (3 if m.gated_mlp else 2) * i + b * i * ("mlp.down_proj" in names))
    moe = m.moe
    assert moe is not None
    k, ie, e = moe.num_experts_per_tok, moe.moe_intermediate_size, moe.num_experts
    gate, up = "mlp.experts.{e}.gate_proj" in names, "mlp.experts.{e}.up_proj" in names
    routed = h * (gate or up) + h  # the routed copy an adapter reads; the expert output the routing weight scales
    routed += 2 * ie * (not (gate and up)) + ie * (gate + up) + ie + ie * ("mlp.experts.{e}.down_proj" in names)
    per += b * h * bool(names & set(MOE_INPUTS)) + e * 4 + k * (b * routed + 24)  # fp32 router softmax, indices
    s = moe.shared_expert_intermediate_size
    if s:
        per += b * (3 * s + s * ("mlp.shared_expert.down_proj" in names) + h)
    return tokens * per


def lora_saved_layer_bytes(m: ModelShape, spec: LoraSpec, tokens: int, b: int) -> int:
    """What autograd keeps of the largest decoder layer when the base is frozen and only the adapters train
    (traced: ``labkit.model.trace_lora``). A frozen linear saves nothing for its own weight, so only what some
    gradient still needs stays: the norms' fp32 inputs (their bf16 normed copies go: the norm weights are frozen),
    what attention saves, the MLP's gate and up outputs and the activation; a linear's input only where its adapter's
    A reads it (the normed hidden state for q/k/v or the MLP, the gated product for down_proj, a MoE's routed copies);
    and each adapter's r-wide A output (a routed expert's on its k·T rows)."""
    return max(_layer_saved(m, i, spec, tokens, b) for i in range(m.num_hidden_layers))


def _dense_mlp_layers(m: ModelShape, spec: LoraSpec) -> list[set[str]]:
    """The adapted names of each dense-MLP layer (gated: a MoE layer's and Nemotron-H's MLPs are not in it)."""
    return [{x.name for x in spec.targets[i]} for i in range(m.num_hidden_layers) if not m.is_moe_layer(i)]


def lora_backward_extra_bytes(m: ModelShape, spec: LoraSpec, tokens: int, b: int) -> int:
    """What the layer being recomputed and backpropagated holds above its saved tensors with the adapters on
    (traced). Dense: in the MLP's backward the gate and up outputs and the activation wait for three T×I gradients
    (the gated product's, the activation's and up's), 6·T·I in all whatever is adapted, of which the saved set had
    3 (4 with down_proj's adapter reading the product, freed by then). MoE: three more k·T×H routed tensors beside
    the saved routed copy and expert output: the incoming gradient of the routed rows with the index backward's
    zeros and result, or (down_proj adapted) the recompute's base output, B output and its scaled copy."""
    names = _dense_mlp_layers(m, spec)
    dense = tokens * b * m.intermediate_size * max((3 - ("mlp.down_proj" in n) for n in names), default=0)
    routed = moe_unsort_grad_bytes(m, tokens, b) if m.num_moe_layers else 0
    return max(dense if m.gated_mlp else 0, routed)


def lora_forward_extra_bytes(m: ModelShape, spec: LoraSpec, tokens: int, b: int) -> int:
    """A dense layer's forward without grad with the adapters on, above the plain one (traced): up_proj's adapter
    adds its scaled B output and the sum beside the base output while the activation waits (4·T·I, not 3); the other
    adapters' temporaries fit under the MLP's own."""
    names = _dense_mlp_layers(m, spec)
    return tokens * b * m.intermediate_size if any("mlp.up_proj" in n for n in names) else 0
