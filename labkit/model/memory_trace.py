"""A trace of one micro-batch's real pass on fake CUDA tensors at a real model's shape: what a GPU would allocate,
op by op, without a GPU and without memory (seconds for a 7B model at 16k tokens on 2 cores).

The Hugging Face decoder (``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` / ``LlamaForCausalLM``, the MoE decoders
``Qwen2MoeForCausalLM`` / ``Qwen3MoeForCausalLM`` with transformers' default grouped_mm experts, or a Qwen2-VL /
Qwen2.5-VL / Qwen3-VL model with its vision tower fed one image a sequence (``labkit.model.trace_vision``); configs
from ``labkit.model.trace_config``) is built from the shape's config in bf16 on fake ``cuda``
(``labkit.model.fake_cuda``), fed one packed row as ``use_remove_padding``
packs it (verl's ``_forward_micro_batch``: ``input_ids`` (1, T) and ``position_ids`` restarting per sequence),
with attention through PyTorch's copy of the flash-attention varlen kernel (``aten._flash_attention_forward``), under
``torch.autocast("cuda", bfloat16)`` as verl runs it. The head mirrors verl's: logits, ``logits / temperature``
when it is not 1, log-probs of the taken tokens and, for old_log_prob (``calculate_entropy=True``) or an update with
entropy, ``entropy_from_logits`` (eager: softmax, logsumexp, ``(p · z).sum``) or its compiled form. The update runs
backward with each parameter's gradient dropped as it is produced (FSDP reduce-scatters and frees it per unit).

A fake tensor allocates only an op's outputs; what a GPU kernel allocates inside an op is added at that op
(``kernel_temporaries``: logsumexp's ``(x - max).exp_()``). Stand-ins (FakeTensor cannot run Triton or inductor): flash_attn's cross-entropy (allocates its O(T) outputs),
compiled entropy (three (T, 1) fp32 statistics and the result), flash-attention's backward workspaces (not added).
On a CPU-only torch this module needs ``labkit.model.fake_cuda.enable()`` before torch is imported: run it through
``labkit.model.trace_runner`` (a fresh process, ``labkit.model.trace_main``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from labkit.memory.model_catalogue import model_shape
from labkit.memory.shapes import ModelShape
from labkit.model.fake_cuda import gpu_granularity
from labkit.model.trace_attention import CU, varlen_attention, vision_attention
from labkit.model.trace_config import VL_TRACEABLE, hf_config, shape_from_dict
from labkit.model.trace_lora import adapter_states, add_adapters
from labkit.model.trace_pass import pass_inputs, run_pass
from labkit.model.trace_vision import VISION_ATTENTION, ImageIndexing, image_inputs

BLOCK = 512  # the CUDA caching allocator rounds every block up to 512 bytes
STAND_INS = (
    "flash_attn cross-entropy (O(T) outputs)",
    "compiled entropy (fused: (T, 1) statistics)",
    "torch fallback head (its per-row loop's bytes in all)",
)
ENTROPY_MODES = ("none", "eager", "compiled", "chunked", "checkpointed")


@dataclass
class Alive:
    """One tensor storage alive at the peak: the op that made it, its shape, dtype and bytes."""

    op: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int


@dataclass
class TraceResult:
    """A traced pass: the peak above the weights, where it happened, and what was alive then (largest first)."""

    peak_bytes: int
    op: str
    module: str
    alive: list[Alive] = field(default_factory=list)
    weights_bytes: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    """How many times each aten op ran (the op granularity a GPU would see)."""
    stand_ins: tuple[str, ...] = STAND_INS
    adapters: dict[str, int] = field(default_factory=dict)
    """LoRA: the adapters' parameter count and the bytes of their fp32 masters, gradients and AdamW states."""


class _Tracker(TorchDispatchMode):
    """Counts the storages every op creates until they die; records the peak, its op and module, and the alive."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = device
        self.live: dict[int, Alive] = {}
        self.now = self.peak = 0
        self.peak_op, self.peak_module, self.peak_alive = "", "", []
        self.module = "model"
        self.before: set[int] = set()
        self.ops: dict[str, int] = {}

    def _free(self, key: int) -> None:
        a = self.live.pop(key, None)
        if a is not None:
            self.now -= a.bytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket.__name__)
        self.ops[name] = self.ops.get(name, 0) + 1
        grew = False
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor) or t.device.type != self.device:  # a VL grid's real arithmetic
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self.live or key in self.before or st.nbytes() == 0:
                continue
            n = _block(st.nbytes())
            self.live[key] = Alive(name, tuple(t.shape), str(t.dtype), n)
            weakref.finalize(st, self._free, key)
            self.now += n
            grew = True
        inner = kernel_temporaries(name, args)
        extra = sum(a.bytes for a in inner)
        if (grew or extra) and self.now + extra > self.peak:
            self.peak, self.peak_op, self.peak_module = self.now + extra, name, self.module
            self.peak_alive = sorted([*self.live.values(), *inner], key=lambda a: -a.bytes)[:40]
        return out


def _block(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


def kernel_temporaries(op: str, args: Any) -> list[Alive]:
    """What a GPU kernel allocates inside ``op`` beyond its outputs (alive only while it runs), which a fake
    tensor cannot see (FakeTensor runs the op's meta function: outputs only). Audited over every op of verl's
    heads: ``_softmax``/``_log_softmax`` and their backward, ``gather``, ``scatter_``, the elementwise products and
    the reductions' kernels write only their outputs (a reduction's O(T) staging aside); ``logsumexp`` is a
    composite on CUDA too (``aten/src/ATen/native/ReduceOps.cpp: logsumexp_out_impl``): the row maxima ``amax``
    (keepdim) and ``(self - maxes).exp_()``, a temporary of the input's size and dtype, summed into the result."""
    if op != "logsumexp" or not args or not isinstance(args[0], torch.Tensor):
        return []
    x, dims = args[0], args[1] if len(args) > 1 else ()
    dims = [d % max(x.dim(), 1) for d in ([dims] if isinstance(dims, int) else list(dims) or range(x.dim()))]
    kept = tuple(1 if i in dims else n for i, n in enumerate(x.shape))
    size = x.element_size()
    maxes = Alive("logsumexp (amax)", kept, str(x.dtype), _block(size * max(1, _numel(kept))))
    diff = Alive("logsumexp ((x - max).exp_())", tuple(x.shape), str(x.dtype), _block(size * x.numel()))
    return [diff, maxes]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _label(module: Any, name: str, tracker: _Tracker) -> None:
    """Name ``module``'s allocations ``name`` in the trace (its forward, and its recomputation in backward)."""
    before: list[str] = []

    def enter(*_: Any) -> None:
        before.append(tracker.module)
        tracker.module = name

    def leave(*_: Any) -> None:
        tracker.module = before.pop()

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave)


def trace_pass(
    shape: ModelShape,
    seq_lengths: list[int],
    update: bool = False,
    entropy: str = "none",
    checkpointing: bool = True,
    temperature: float = 1.0,
    head: str = "flash_attn",
    device: str = "cuda",
    fused: bool = False,
    entropy_chunk: int = 2048,
    temperature_copy: bool = False,
    sp: int = 1,
    padded: str = "",
    width: int = 0,
    response_length: int = 0,
    profile: str = "engine",
    layers: int = 0,
    image_tokens: int = 0,
    lora: dict[str, Any] | None = None,
) -> TraceResult:
    """Trace one packed micro-batch of ``seq_lengths`` through ``shape``: forward under no_grad (a log-prob pass)
    or forward + backward (``update``); ``entropy`` none | eager | compiled | chunked (``entropy_chunk`` rows at a
    time) | checkpointed (eager under ``torch.utils.checkpoint``); ``head`` flash_attn (the Triton cross-entropy,
    stand-in) or torch (verl's fallback, a log-softmax per token row); ``fused`` verl's fused log-prob kernel (torch
    backend) from the hidden states instead of logits; ``temperature_copy``: the engine divides into a copy while the
    model's output still holds the logits (legacy divides in place); ``sp``: Ulysses SP, ``seq_lengths`` being the
    whole SP group's micro-batch, of which this rank feeds its 1/SP slice (padded to a multiple of SP, as verl
    pads); ``padded`` legacy | engine: ``use_remove_padding=False``, each sequence a row padded to ``width`` (legacy:
    prompt + response; the engine: the micro-batch's longest), legacy's head on the last ``response_length``
    positions; ``profile``: the order of the head (legacy: log-probs, then the entropy; the engine: the entropy
    first); ``layers`` > 0: build that many decoder layers (the same per-layer peak; a 48-layer MoE in seconds);
    ``image_tokens`` (a VL model, packed, without SP): each sequence opens with an image of that many tokens, which
    the vision tower encodes first (``labkit.model.trace_vision``); ``lora`` {rank, targets, enabled}: PEFT-shaped
    adapters on a frozen base (``labkit.model.trace_lora``), their model states counted after an update."""
    if padded not in ("", "legacy", "engine") or (padded and (sp > 1 or width < max(seq_lengths))):
        raise ValueError("padded is legacy or engine, without SP, with a width of at least the longest sequence")
    if entropy not in ENTROPY_MODES or head not in ("flash_attn", "torch"):
        raise ValueError(f"entropy must be one of {ENTROPY_MODES} and head flash_attn or torch")
    if sp < 1 or shape.num_attention_heads % sp:
        raise ValueError(
            f"Ulysses SP {sp} must divide the {shape.num_attention_heads} attention heads (verl asserts it)"
        )
    vl = shape.architecture in VL_TRACEABLE
    if vl and (padded or sp > 1 or image_tokens < 1 or image_tokens > min(seq_lengths)):
        raise ValueError("a VL model is traced packed, without SP, with 1 <= image_tokens <= each sequence's length")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoModelForImageTextToText

    AttentionInterface.register("labkit_varlen", varlen_attention)
    AttentionInterface.register(VISION_ATTENTION, vision_attention)
    if device == "cuda":
        gpu_granularity()
    cfg = hf_config(shape, layers)
    cfg._attn_implementation = "labkit_varlen"
    with FakeTensorMode(allow_non_fake_inputs=True):
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(device):
                model = (AutoModelForImageTextToText if vl else AutoModelForCausalLM).from_config(cfg)
        finally:
            torch.set_default_dtype(default)
        if update and checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False, "preserve_rng_state": False}
            )
        model.train(update)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        for p in model.parameters():
            p.requires_grad_(update)
            if update:  # FSDP reduce-scatters each unit's gradient and frees the full one
                p.register_post_accumulate_grad_hook(lambda q: setattr(q, "grad", None))
        if lora:
            add_adapters(model, lora, update)
        ids, pos, mask = pass_inputs(seq_lengths, sp, padded, width, device)
        images: dict[str, Any] = {}
        tracker = _Tracker(device)
        if vl:  # mRoPE's three position rows; the tower in verl's flash_attention_2
            pos = pos.unsqueeze(0).expand(3, *pos.shape).contiguous()
            model.model.visual.config._attn_implementation_internal = VISION_ATTENTION
            images = image_inputs(model, len(seq_lengths), image_tokens, device)
            _label(model.model.visual, "vision", tracker)
        indexing = ImageIndexing(ids.shape[-1], len(seq_lengths) * image_tokens) if vl else contextlib.nullcontext()
        tensors = [v for v in images.values() if isinstance(v, torch.Tensor)]
        inputs = [ids, pos, CU["cu"], *tensors, *([mask, CU["indices"]] if padded else [])]
        for t in [*model.parameters(), *model.buffers(), *inputs]:  # alive before: not the pass's
            tracker.before.add(t.untyped_storage()._cdata)
        with indexing, tracker, torch.set_grad_enabled(update), torch.autocast(device, torch.bfloat16):
            head_spec = {
                "entropy": entropy,
                "temperature": temperature,
                "head": head,
                "fused": fused,
                "entropy_chunk": entropy_chunk,
                "temperature_copy": temperature_copy,
                "padded": padded,
                "response_length": response_length,
                "profile": profile,
            }
            run_pass(model, (ids, pos, mask), update, head_spec, tracker, images)
        adapters = adapter_states(model) if lora and update else {}
    used = [
        not fused and head == "flash_attn",
        not fused and entropy == "compiled",
        not fused and head == "torch",
    ]
    stand_ins = tuple(name for name, on in zip(STAND_INS, used) if on)
    tr = tracker
    return TraceResult(tr.peak, tr.peak_op, tr.peak_module, tr.peak_alive, weights, tr.ops, stand_ins, adapters)


def main() -> None:
    """``python -m labkit.model.trace_main`` with a JSON list of specs on stdin (``model`` a shape name or a
    ModelShape's fields): imports transformers first (while the caller is still deciding), then trace_pass(**spec)
    for each; prints the results as one JSON list (``trace_runner`` reads it)."""
    import transformers  # noqa: F401  the slow import, before the specs arrive

    out = []
    for spec in json.loads(sys.stdin.read()):
        m = spec.pop("model")
        shape = model_shape(m) if isinstance(m, str) else shape_from_dict(m)
        out.append(asdict(trace_pass(shape, **spec)))
    print(json.dumps(out))
