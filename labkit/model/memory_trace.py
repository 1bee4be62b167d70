"""A trace of one micro-batch's real pass on fake CUDA tensors at a real model's shape: what a GPU would allocate,
op by op, without a GPU and without memory (seconds for a 7B model at 16k tokens on 2 cores).

The Hugging Face decoder (``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` / ``LlamaForCausalLM``) is built from the
shape's config in bf16 on fake ``cuda`` (``labkit.model.fake_cuda``), fed one packed row as ``use_remove_padding``
packs it (verl's ``_forward_micro_batch``: ``input_ids`` (1, T) and ``position_ids`` restarting per sequence),
with attention through PyTorch's copy of the flash-attention varlen kernel (``aten._flash_attention_forward``), under
``torch.autocast("cuda", bfloat16)`` as verl runs it. The head mirrors verl's: logits, ``logits / temperature``
when it is not 1, log-probs of the taken tokens and, for old_log_prob (``calculate_entropy=True``) or an update with
entropy, ``entropy_from_logits`` (eager: softmax, logsumexp, ``(p · z).sum``) or its compiled form. The update runs
backward with each parameter's gradient dropped as it is produced (FSDP reduce-scatters and frees it per unit).

Stand-ins (FakeTensor cannot run Triton or inductor): flash_attn's cross-entropy (allocates its O(T) outputs),
compiled entropy (three (T, 1) fp32 statistics and the result), flash-attention's backward workspaces (not added).
On a CPU-only torch this module needs ``labkit.model.fake_cuda.enable()`` before torch is imported: run it through
``labkit.model.trace_runner`` (a fresh process, ``labkit.model.trace_main``).
"""

from __future__ import annotations

import json
import sys
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from labkit.memory.shapes import ModelShape, model_shape

BLOCK = 512  # the CUDA caching allocator rounds every block up to 512 bytes
STAND_INS = ("flash_attn cross-entropy (O(T) outputs)", "compiled entropy (fused: (T, 1) statistics)")


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


class _Tracker(TorchDispatchMode):
    """Counts the storages every op creates until they die; records the peak, its op and module, and the alive."""

    def __init__(self) -> None:
        super().__init__()
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
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self.live or key in self.before or st.nbytes() == 0:
                continue
            n = -(-st.nbytes() // BLOCK) * BLOCK
            self.live[key] = Alive(str(func.overloadpacket.__name__), tuple(t.shape), str(t.dtype), n)
            weakref.finalize(st, self._free, key)
            self.now += n
            grew = True
        if grew and self.now > self.peak:
            self.peak, self.peak_op, self.peak_module = self.now, str(func.overloadpacket.__name__), self.module
            self.peak_alive = sorted(self.live.values(), key=lambda a: -a.bytes)[:40]
        return out


def _hf_config(shape: ModelShape) -> Any:
    import transformers as tf

    cls = {"qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config, "llama": tf.LlamaConfig}[shape.architecture]
    extra = {"attention_bias": shape.attention_bias} if shape.architecture == "llama" else {}
    if shape.architecture == "qwen3":
        extra = {"head_dim": shape.head_dim}
    return cls(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        vocab_size=shape.vocab_size,
        tie_word_embeddings=shape.tie_word_embeddings,
        max_position_embeddings=max(shape.max_position_embeddings, 2**17),
        **extra,
    )


_CU: dict[str, Any] = {}
GPU_NATIVE = ("silu_backward", "logsumexp")
"""Ops with a native CUDA kernel that a CPU build sends to a composite fallback on fake ``cuda`` tensors (more ops,
more temporaries than a GPU makes): a never-called CUDA kernel restores the GPU's granularity."""
_LIB: list[Any] = []


def _gpu_granularity() -> None:
    if _LIB:
        return
    lib = torch.library.Library("aten", "IMPL")

    def never(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a real CUDA kernel was called on fake CUDA")

    for op in GPU_NATIVE:
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CUDA"):
            lib.impl(op, never, "CUDA")
    _LIB.append(lib)


def _varlen_attention(
    module: Any, q: Any, k: Any, v: Any, mask: Any, scaling: Any = None, dropout: float = 0.0, **kw: Any
) -> Any:
    """HF attention through FA2's varlen kernel on the packed row ((1, h, T, d) -> (1, T, h, d)); verl's path on
    GPUs with ``use_remove_padding``."""
    qq, kk, vv = (x.transpose(1, 2)[0] for x in (q, k, v))
    cu, longest = _CU["cu"], _CU["max"]
    out = torch.ops.aten._flash_attention_forward(qq, kk, vv, cu, cu, longest, longest, 0.0, True, False, scale=scaling)
    return out[0].unsqueeze(0), None


def _entropy_eager(logits: torch.Tensor) -> torch.Tensor:
    """verl's ``entropy_from_logits``: softmax, logsumexp, minus the expected logit (under autocast: fp32)."""
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


class _CompiledEntropy(torch.autograd.Function):
    """Stand-in for inductor's fused entropy: three (T, 1) fp32 statistics and the (T,) result, nothing T × V."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor) -> torch.Tensor:
        stats = [logits.new_empty((logits.shape[0], 1), dtype=torch.float32) for _ in range(3)]
        ctx.save_for_backward(logits, *stats)
        return logits.new_empty(logits.shape[0], dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(ctx.saved_tensors[0])


class _FlashCrossEntropy(torch.autograd.Function):
    """Stand-in for flash_attn's Triton cross-entropy (verl's ``logprobs_from_logits`` on GPUs): O(T) outputs; the
    backward writes the logits' gradient into the logits (``inplace_backward=True``)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        lse = logits.new_empty(logits.shape[0], dtype=torch.float32)
        ctx.save_for_backward(logits, lse)
        return logits.new_empty(logits.shape[0], dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.saved_tensors[0], None  # inplace_backward=True, as verl calls it: the grad overwrites the logits


def trace_pass(
    shape: ModelShape,
    seq_lengths: list[int],
    update: bool = False,
    entropy: str = "none",
    checkpointing: bool = True,
    temperature: float = 1.0,
    head: str = "flash_attn",
    device: str = "cuda",
) -> TraceResult:
    """Trace one packed micro-batch of ``seq_lengths`` through ``shape``: forward under no_grad (a log-prob pass)
    or forward + backward (``update``); ``entropy`` none | eager | compiled; ``head`` flash_attn (the Triton
    cross-entropy, stand-in) or torch (verl's fallback: log_softmax and gather)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AttentionInterface, AutoModelForCausalLM

    AttentionInterface.register("labkit_varlen", _varlen_attention)
    if device == "cuda":
        _gpu_granularity()
    cfg = _hf_config(shape)
    cfg._attn_implementation = "labkit_varlen"
    total = sum(seq_lengths)
    with FakeTensorMode(allow_non_fake_inputs=True):
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(cfg)
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
        cuts = [0]
        for n in seq_lengths:
            cuts.append(cuts[-1] + n)
        _CU.update(cu=torch.tensor(cuts, dtype=torch.int32, device=device), max=max(seq_lengths))
        ids = torch.zeros(1, total, dtype=torch.long, device=device)
        pos = torch.cat([torch.arange(n, device=device) for n in seq_lengths]).unsqueeze(0)
        tracker = _Tracker()
        for t in [*model.parameters(), *model.buffers(), ids, pos, _CU["cu"]]:  # alive before: not the pass's
            tracker.before.add(t.untyped_storage()._cdata)
        with tracker, torch.set_grad_enabled(update), torch.autocast(device, torch.bfloat16):
            _run(model, ids, pos, update, entropy, temperature, head, tracker)
    return TraceResult(tracker.peak, tracker.peak_op, tracker.peak_module, tracker.peak_alive, weights, tracker.ops)


def _run(
    model: Any, ids: Any, pos: Any, update: bool, entropy: str, temperature: float, head: str, tr: _Tracker
) -> None:
    tr.module = "decoder"
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits.squeeze(0)  # verl: rmpad squeeze
    tr.module = "head"
    if temperature != 1.0:
        logits = logits.div(temperature)
    labels = ids[0]
    if head == "flash_attn":
        logp = -_FlashCrossEntropy.apply(logits, labels)
    else:  # verl's logprobs_from_logits_v2 without flash_attn: log_softmax rows, gather the taken token
        logp = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ent = None
    if entropy == "eager":
        tr.module = "entropy"
        ent = _entropy_eager(logits)
    elif entropy == "compiled":
        tr.module = "entropy"
        ent = _CompiledEntropy.apply(logits)
    if update:
        loss = -logp.float().mean() + (0 if ent is None else -0.01 * ent.float().mean())
        del logits, logp, ent
        tr.module = "backward"
        loss.backward()


def main() -> None:
    """``python -m labkit.model.trace_main SPECS_JSON``: trace_pass(**spec) for each spec of a JSON list (``model``
    a shape name or a ModelShape's fields); prints the results as one JSON list (``trace_runner`` reads it)."""
    out = []
    for spec in json.loads(sys.argv[1]):
        m = spec.pop("model")
        shape = model_shape(m) if isinstance(m, str) else ModelShape(**m)
        out.append(asdict(trace_pass(shape, **spec)))
    print(json.dumps(out))
