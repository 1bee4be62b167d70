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

from labkit.memory.phases import FUSED_CHUNK
from labkit.memory.shapes import ModelShape, model_shape
from labkit.model.trace_attention import CU, varlen_attention
from labkit.model.trace_heads import (
    FlashCrossEntropy,
    FusedLinearPPO,
    entropy_of,
    logprobs_rows,
)

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
    first)."""
    if padded not in ("", "legacy", "engine") or (padded and (sp > 1 or width < max(seq_lengths))):
        raise ValueError("padded is legacy or engine, without SP, with a width of at least the longest sequence")
    if entropy not in ENTROPY_MODES or head not in ("flash_attn", "torch"):
        raise ValueError(f"entropy must be one of {ENTROPY_MODES} and head flash_attn or torch")
    if sp < 1 or shape.num_attention_heads % sp:
        raise ValueError(
            f"Ulysses SP {sp} must divide the {shape.num_attention_heads} attention heads (verl asserts it)"
        )
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AttentionInterface, AutoModelForCausalLM

    AttentionInterface.register("labkit_varlen", varlen_attention)
    if device == "cuda":
        _gpu_granularity()
    cfg = _hf_config(shape)
    cfg._attn_implementation = "labkit_varlen"
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
        ids, pos, mask = _inputs(seq_lengths, sp, padded, width, device)
        tracker = _Tracker()
        inputs = [ids, pos, CU["cu"], *([mask, CU["indices"]] if padded else [])]
        for t in [*model.parameters(), *model.buffers(), *inputs]:  # alive before: not the pass's
            tracker.before.add(t.untyped_storage()._cdata)
        with tracker, torch.set_grad_enabled(update), torch.autocast(device, torch.bfloat16):
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
            _run(model, (ids, pos, mask), update, head_spec, tracker)
    used = [
        not fused and head == "flash_attn",
        not fused and entropy == "compiled",
        not fused and head == "torch",
    ]
    stand_ins = tuple(name for name, on in zip(STAND_INS, used) if on)
    return TraceResult(
        tracker.peak, tracker.peak_op, tracker.peak_module, tracker.peak_alive, weights, tracker.ops, stand_ins
    )


def _inputs(seq_lengths: list[int], sp: int, padded: str, width: int, device: str) -> tuple[Any, Any, Any]:
    """The model's inputs and ``CU``: packed, one (1, T/SP) row with positions restarting per sequence (verl's
    rmpad); padded, a (rows, width) batch, each row's real tokens first, and its attention mask."""
    total = sum(seq_lengths)
    cuts = [0]
    for n in seq_lengths:
        cuts.append(cuts[-1] + n)
    if padded:
        rows = len(seq_lengths)
        mask = torch.zeros(rows, width, dtype=torch.long, device=device)
        indices = torch.cat([torch.arange(n, device=device) + r * width for r, n in enumerate(seq_lengths)])
        CU.update(
            cu=torch.tensor(cuts, dtype=torch.int32, device=device),
            max=max(seq_lengths),
            indices=indices,
            lengths=seq_lengths,
        )
        pos = torch.arange(width, device=device).expand(rows, width)
        return torch.zeros(rows, width, dtype=torch.long, device=device), pos, mask
    CU.pop("indices", None), CU.pop("lengths", None)
    local = -(-total // sp)  # verl's ulysses_pad_and_slice_inputs: pad to a multiple of SP, one slice per rank
    if local * sp > total:
        cuts.append(local * sp)
    CU.update(cu=torch.tensor(cuts, dtype=torch.int32, device=device), max=max(seq_lengths), sp=sp)
    ids = torch.zeros(1, local, dtype=torch.long, device=device)
    pos = torch.cat([torch.arange(n, device=device) for n in seq_lengths])[:local].unsqueeze(0)
    return ids, pos, None


def _run(model: Any, inputs: tuple[Any, Any, Any], update: bool, spec: dict[str, Any], tr: _Tracker) -> None:
    """The decoder, then verl's head as ``spec`` says (entropy mode, temperature, head kernel, fused), then backward
    of a loss on the log-probs (and the entropy) for an update."""
    ids, pos, mask = inputs
    if spec["padded"] and not spec["fused"]:
        return _run_padded(model, inputs, update, spec, tr)
    entropy, temperature, labels = spec["entropy"], spec["temperature"], ids.reshape(-1)
    tr.module = "decoder"
    if spec["fused"]:
        hidden = model.model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False)
        hidden = hidden.last_hidden_state.reshape(-1, model.config.hidden_size)
        tr.module = "head"
        logp, ent = FusedLinearPPO.apply(hidden, model.lm_head.weight, labels, temperature, FUSED_CHUNK)
        ent = None if entropy == "none" else ent
        del hidden
    else:
        output = model(input_ids=ids, position_ids=pos, use_cache=False)
        logits = output.logits.squeeze(0)  # verl: rmpad squeeze
        tr.module = "head"
        if temperature != 1.0 and spec["temperature_copy"]:  # the engine: a copy (none at 1), the output kept
            logits = logits / temperature
        elif temperature != 1.0:  # legacy: in place
            logits.div_(temperature)
        # flash_attn's backward writes into the logits only when no entropy needs them (both profiles' rmpad path)
        inplace = entropy == "none"
        if spec["profile"] == "legacy":  # dp_actor: the log-probs, then the entropy
            logp = _logprobs(spec["head"], logits, labels, inplace)
            tr.module = "entropy"
            ent = entropy_of(entropy, logits, spec["entropy_chunk"])
        else:  # the engine: the entropy, then the log-probs
            tr.module = "entropy"
            ent = entropy_of(entropy, logits, spec["entropy_chunk"])
            tr.module = "head"
            logp = _logprobs(spec["head"], logits, labels, inplace)
        del logits, output  # the pass returns: the model's output goes before backward
    _backward(update, logp, ent, tr)


def _backward(update: bool, logp: Any, ent: Any, tr: _Tracker) -> None:
    """An update's loss on the log-probs (and the entropy), and its backward."""
    if update:
        loss = -logp.float().mean() + (0 if ent is None else -0.01 * ent.float().mean())
        del logp, ent
        tr.module = "backward"
        loss.backward()


def _run_padded(model: Any, inputs: tuple[Any, Any, Any], update: bool, spec: dict[str, Any], tr: _Tracker) -> None:
    """The padded path's head (``use_remove_padding=False``). Legacy (``dp_actor._forward_micro_batch``): the
    (rows, width, V) logits divided in place, sliced to the response positions, log-probs (flash_attn flattens the
    slice: a copy when rows > 1), then the plain entropy of the slice. The engine (``prepare_model_outputs``): the
    entropy of every padded position, then the real tokens' logits concatenated (a copy) for the log-probs."""
    ids, pos, mask = inputs
    tr.module = "decoder"
    output = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False)
    logits, vocab = output.logits, output.logits.shape[-1]
    tr.module = "head"
    temperature = spec["temperature"]
    if spec["padded"] == "legacy":
        if temperature != 1.0:
            logits.div_(temperature)
        logits = logits[:, -spec["response_length"] - 1 : -1, :]
        labels = ids[:, : logits.shape[1]].reshape(-1)
        flat = logits.reshape(-1, vocab) if spec["head"] == "flash_attn" else logits  # torch: a loop over rows
        logp = _logprobs(spec["head"], flat, labels, True)
        del flat
        tr.module = "entropy"
        ent = entropy_of(spec["entropy"], logits, 0)
    else:
        if temperature != 1.0:
            logits = logits / temperature
        tr.module = "entropy"
        ent = entropy_of(spec["entropy"], logits, 0)
        tr.module = "head"
        real = torch.cat([row[:n] for row, n in zip(logits.unbind(), CU["lengths"])])
        logp = _logprobs(spec["head"], real, ids.reshape(-1)[: real.shape[0]], True)
        del real
    del logits, output
    _backward(update, logp, ent, tr)


def _logprobs(head: str, logits: Any, labels: Any, inplace: bool) -> Any:
    """verl's ``logprobs_from_logits`` on (tokens, V) logits: flash_attn's cross-entropy (``inplace_backward``) or
    the torch rows."""
    if head == "flash_attn":
        return -FlashCrossEntropy.apply(logits, labels, inplace)
    return logprobs_rows(logits, labels)


def main() -> None:
    """``python -m labkit.model.trace_main`` with a JSON list of specs on stdin (``model`` a shape name or a
    ModelShape's fields): imports transformers first (while the caller is still deciding), then trace_pass(**spec)
    for each; prints the results as one JSON list (``trace_runner`` reads it)."""
    import transformers  # noqa: F401  the slow import, before the specs arrive

    out = []
    for spec in json.loads(sys.stdin.read()):
        m = spec.pop("model")
        shape = model_shape(m) if isinstance(m, str) else ModelShape(**m)
        out.append(asdict(trace_pass(shape, **spec)))
    print(json.dumps(out))
