"""What megatron-core 0.16.1 needs to run on fake CUDA tensors on a CPU-only torch, for
``labkit.model.trace_megatron``: a current device, CUDA streams and RNG states that do nothing, Transformer Engine's
absent names, data-independent MoE token counts (capacity-padded routing), and the stand-ins of
``labkit.model.trace_megatron_parts`` put into megatron's local layer spec. Import only under
``labkit.model.fake_cuda.enable()`` with the oracle on ``sys.path``.
"""

from __future__ import annotations

import contextlib
from typing import Any


class _Counts(list):
    """Tokens per local expert as a list that answers ``tolist()`` like the tensor megatron expects."""

    def tolist(self) -> list[int]:
        return list(self)


class _NoFP8:
    """Transformer Engine's FP8 state as megatron asks it when TE is absent: FP8 off."""

    @staticmethod
    def is_fp8_enabled() -> bool:
        return False

    @staticmethod
    def get_fp8_recipe() -> None:
        return None


class _Stream:
    """A CUDA stream that orders nothing (one fake device, no kernels)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, *args: Any) -> _Stream:  # an event that orders nothing either
        return self

    def wait(self, *args: Any) -> None:
        pass


def patch_megatron() -> None:
    """What a CPU build lacks: a current CUDA device, CUDA RNG states; and the stand-ins into the local spec."""
    import torch
    from megatron.core import jit

    jit.disable_jit_fuser()  # megatron's fused kernels run eagerly (torch.compile cannot run on fake tensors)
    from megatron.core.fusions import fused_bias_swiglu
    from megatron.core.models import backends
    from megatron.core.tensor_parallel import random as mrand
    from megatron.core.transformer import attention, transformer_block

    from labkit.model import trace_megatron_parts as parts

    torch.cuda.current_device = lambda: 0
    torch.cuda.set_device = lambda *a: None
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.Stream = _Stream
    torch.cuda.current_stream = lambda *a: _Stream()
    torch.cuda.stream = lambda *a: contextlib.nullcontext()
    mrand.CudaRNGStatesTracker.fork = lambda self, *a, **k: contextlib.nullcontext()
    mrand._get_cuda_rng_state = lambda *a, **k: torch.zeros(1)
    mrand._set_cuda_rng_state = lambda *a, **k: None
    mrand.CudaRNGStatesTracker.get_states = lambda self: {}
    mrand.CudaRNGStatesTracker.set_states = lambda self, states: None
    mrand.FP8GlobalStateManager = _NoFP8  # selective recompute asks TE's FP8 state even without TE
    mrand.activation_recompute_forward = lambda **kwargs: contextlib.nullcontext()
    mrand.fp8_autocast = lambda **kwargs: contextlib.nullcontext()
    backends.LocalSpecProvider.layer_norm = lambda self, rms_norm=False, for_qk=False: parts.FusedNorm
    backends.LocalSpecProvider.core_attention = lambda self: parts.FlashCoreAttention
    transformer_block.LayerNormImpl = parts.FusedNorm
    fused_bias_swiglu.swiglu, fused_bias_swiglu.swiglu_back = parts.fused_swiglu, parts.fused_swiglu_back
    attention.apply_rotary_pos_emb = parts.fused_rope
    from megatron.core.transformer.moe import moe_utils

    moe_utils.te_general_gemm = None  # megatron-core 0.16.1 leaves the name undefined without Transformer Engine
    from megatron.core.transformer.moe.experts import SequentialMLP

    sequential = SequentialMLP.forward

    def balanced(self: Any, hidden: Any, tokens_per_expert: Any, probs: Any) -> Any:
        """Capacity-padded routing gives every local expert the same count; fake tensors hold no counts."""
        share = [hidden.shape[0] // self.num_local_experts] * self.num_local_experts
        return sequential(self, hidden, _Counts(share), probs)

    SequentialMLP.forward = balanced
    from megatron.core.models.common.embeddings import rotary_pos_embedding

    def cp_slice(emb: Any, seq_dim: int, cp_group: Any) -> Any:
        """This CP rank's two of the 2·CP RoPE chunks (``rope_utils.get_pos_emb_on_this_cp_rank`` pins a CPU index)."""
        n = emb.shape[seq_dim] // cp_group.size()
        return emb.narrow(seq_dim, 0, n).clone()

    rotary_pos_embedding.get_pos_emb_on_this_cp_rank = cp_slice
