"""Stand-ins for the fused kernels verl's Megatron backend runs through Transformer Engine, for the fake-CUDA trace of
megatron-core's own ``GPTModel`` (``labkit.model.trace_megatron``), and verl's LM-head processing of the logits.

megatron-core's local layer spec (no Transformer Engine) has two pieces a trace of verl's run cannot use as they are:
``WrappedTorchNorm`` refuses sequence parallelism, and ``DotProductAttention`` materialises the s×s scores where verl
runs flash attention (``attention_backend: flash``). These stand-ins allocate what TE's fused kernels allocate:
RMSNorm saves its input and a per-token fp32 ``rstd`` (``transformer_engine/pytorch/module/rmsnorm.py``), attention
runs PyTorch's copy of the FA2 kernel (out ``(T, heads, d)``, softmax_lse fp32). The head mirrors
``verl/workers/engine/megatron/transformer_impl.py: MegatronEngine._lm_head_logits_processor``: ``logits.div_`` by
the temperature, with the entropy a ``clone()`` and ``verl/utils/megatron/tensor_parallel.py: vocab_parallel_entropy``
(its ``torch.compile``'d product-sum stands in as a fused reduction), then megatron-core's own
``vocab_parallel_cross_entropy`` for the log-probs. Import only under ``labkit.model.fake_cuda.enable()``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode


class _FusedRMSNorm(torch.autograd.Function):
    """TE's fused RMSNorm: output like the input; saved: the input and a per-token fp32 rstd."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)  # new_*: fake in a backward's recompute too
        ctx.save_for_backward(x, w, rstd)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w)


class FusedNorm(torch.nn.Module):
    """A norm module with megatron's constructor signature that works with sequence parallelism (each rank
    normalises its own tokens; the weight's gradient is all-reduced over TP, which costs no memory here)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, dtype=config.params_dtype, device="cuda"))
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FusedRMSNorm.apply(x, self.weight)


class FlashCoreAttention(torch.nn.Module):
    """Core attention through ``aten._flash_attention_forward`` (FA2, causal, GQA without repeating K/V), on the
    rank's tokens; with CP the ring exchange of K/V chunks is not modelled."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: Any, **_: Any) -> None:
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
        s, b, heads, d = q.shape
        n = s * b
        cu = q.new_zeros(2, dtype=torch.int32)
        out = torch.ops.aten._flash_attention_forward(
            q.reshape(n, heads, d),
            k.reshape(n, k.shape[2], d),
            v.reshape(n, v.shape[2], d),
            cu,
            cu,
            n,
            n,
            0.0,
            True,
            False,
        )[0]
        return out.reshape(s, b, heads * d)


class _VocabParallelEntropy(torch.autograd.Function):
    """verl's ``_VocabParallelEntropy`` tensor for tensor: ``logits − max`` exp'd and divided in place (the softmax),
    the product-sum as a fused reduction (``torch.compile`` in verl); saves the logits and the softmax."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor) -> torch.Tensor:
        group = _tp_group()
        logits_max = logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        softmax = (logits - logits_max).exp_()
        sum_exp = softmax.sum(dim=-1, keepdim=True)
        dist.all_reduce(sum_exp, group=group)
        softmax.div_(sum_exp)
        weighted = torch.bmm(softmax.reshape(-1, 1, logits.shape[-1]), logits.reshape(-1, logits.shape[-1], 1))
        weighted = weighted.reshape(*logits.shape[:-1], 1)
        dist.all_reduce(weighted, group=group)
        ctx.save_for_backward(logits, softmax, weighted)
        return (logits_max + sum_exp.log() - weighted).squeeze(-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        logits, softmax, weighted = ctx.saved_tensors
        logits.sub_(weighted)
        softmax.mul_(logits).mul_(grad.unsqueeze(-1))
        logits.add_(weighted)
        return softmax.mul_(-1)


def fused_swiglu(y: torch.Tensor) -> torch.Tensor:
    """megatron's ``swiglu`` as its compiled kernel runs it: one output [.., I], no temporaries."""
    return y.new_empty(*y.shape[:-1], y.shape[-1] // 2)


def fused_swiglu_back(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """megatron's ``swiglu_back`` as its compiled kernel runs it: the input's gradient [.., 2I] only."""
    return torch.empty_like(y)


class _FusedRope(torch.autograd.Function):
    """TE's fused RoPE (verl sets ``apply_rope_fusion``): a new rotated tensor, nothing saved but the shared table."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(grad)


def fused_rope(t: torch.Tensor, freqs: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    """Stand-in for ``apply_rotary_pos_emb`` (megatron's unfused path saves bf16 cos/sin copies per call)."""
    return _FusedRope.apply(t)


def _tp_group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


def lm_head(logits: torch.Tensor, labels: torch.Tensor, temperature: float, entropy: bool) -> dict[str, torch.Tensor]:
    """verl's head on the last stage's vocabulary-parallel logits ``[1, T, V/TP]``: divide in place, the entropy on
    a clone, log-probs from megatron-core's ``vocab_parallel_cross_entropy``."""
    from megatron.core import tensor_parallel

    logits.div_(temperature)
    out: dict[str, torch.Tensor] = {}
    kept = logits
    if entropy:
        kept = logits.clone()
        out["entropy"] = _VocabParallelEntropy.apply(logits)
    out["log_probs"] = -tensor_parallel.vocab_parallel_cross_entropy(kept, labels)
    return out


BLOCK = 512  # the CUDA caching allocator rounds every block up to 512 bytes


class StorageMeter(TorchDispatchMode):
    """Live bytes of the storages ops create (512-byte blocks) until they die, the peak, its op, and what is alive
    then as ``(op, shape, dtype) -> [count, bytes]``; storages in ``before`` (the model states) are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[str, int]] = {}
        self.now = self.peak = 0
        self.peak_op = ""
        self.at_peak: dict[str, list[int]] = {}
        self.before: set[int] = set()

    def _free(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.now -= entry[1]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        grew = False
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self.live or key in self.before or st.nbytes() == 0:
                continue
            n = -(-st.nbytes() // BLOCK) * BLOCK
            self.live[key] = (f"{func.overloadpacket.__name__} {list(t.shape)} {t.dtype}", n)
            weakref.finalize(st, self._free, key)
            self.now += n
            grew = True
        if grew and self.now > self.peak:
            self.peak, self.peak_op = self.now, str(func.overloadpacket.__name__)
            self.at_peak = {}
            for label, n in self.live.values():
                entry = self.at_peak.setdefault(label, [0, 0])
                entry[0] += 1
                entry[1] += n
        return out
