"""megatron-core's own optimizer on a traced stage (``labkit.model.trace_megatron``): what it holds on the GPU and on
the CPU after one step, the witness of ``labkit.memory.megatron_params.OptimizerBytes``.

verl builds it with ``verl/utils/megatron/optimizer.py: init_megatron_optim_config`` (bf16, the distributed
optimizer, ``override_optimizer_config`` passed through) and megatron-core's ``get_megatron_optimizer``: the
``DistributedOptimizer`` over the DDP buffers' shards, whose inner optimizer is torch's AdamW (this oracle has no
Transformer Engine; TE's FusedAdam keeps states of the same dtypes) or, with ``optimizer_cpu_offload``, the
``HybridDeviceOptimizer`` (``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``) that moves
``optimizer_offload_fraction`` of the shards' elements to CPU AdamW. Every storage created while the optimizer is
built and stepped is counted (``labkit.model.held_bytes``) until it dies; what is alive after the step is what the
optimizer holds between steps. Import only under ``labkit.model.fake_cuda.enable()``.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from labkit.model.held_bytes import HeldBytes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""Precision-aware dtype names as verl writes them (``PrecisionType``)."""


def megatron_optimizer_config(options: dict[str, Any]) -> Any:
    """megatron-core's ``OptimizerConfig`` as verl's ``init_megatron_optim_config`` makes it for bf16, with
    ``options`` as ``override_optimizer_config`` (dtype fields by verl's names: fp32, bf16, fp16)."""
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer import optimizer_config as config_module

    config_module.is_te_min_version = lambda *a, **k: True  # verl's images carry Transformer Engine >= 2.1
    over = {k: DTYPES.get(v, v) if k.endswith("_dtype") else v for k, v in options.items()}
    return OptimizerConfig(
        optimizer="adam", lr=1e-6, min_lr=0.0, clip_grad=1.0, weight_decay=0.01, use_distributed_optimizer=True,
        bf16=True, params_dtype=torch.bfloat16, **over,
    )  # fmt: skip


def _no_item(step: Any) -> Any:
    """torch's Adam reads its step count with ``.item()``, which a fake tensor cannot answer: one step."""
    return 1.0


def _same_everywhere(out: list[Any], obj: Any, group: Any = None) -> None:
    """``all_gather_object`` on the fake process group: every rank of a traced stage holds the same groups."""
    out[:] = [obj] * len(out)


def traced_optimizer(chunks: list[Any], options: dict[str, Any]) -> dict[str, int]:
    """Build megatron-core's optimizer over the DDP ``chunks`` (whose grad buffers hold a backward's gradients) and
    run one step; the bytes it then holds on the GPU and on the CPU (main params, Adam states, CPU copies)."""
    import torch.optim.adam as adam
    import torch.optim.adamw as adamw
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.optimizer import optimizer as mopt

    for module in (adam, adamw):
        if hasattr(module, "_get_value"):
            module._get_value = _no_item
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # page-locking changes no byte count
    torch.distributed.all_gather_object = _same_everywhere
    mopt.get_grad_norm_fp32 = lambda *a, **k: 1.0  # a norm reads values; it holds O(1) bytes
    # the updated shards' all-gather writes into the bf16 param buffer the DDP holds already (a coalesced
    # collective the fake process group cannot run)
    DistributedDataParallel.start_param_sync = lambda self, *a, **k: None
    meter = HeldBytes()
    with meter:
        opt = get_megatron_optimizer(megatron_optimizer_config(options), chunks, use_gloo_process_groups=False)
        opt.step()
    gc.collect()  # the HybridDeviceOptimizer megatron-core builds first and replaces (a reference cycle)
    held = {"optimizer_gpu": meter.held("cuda"), "optimizer_cpu": meter.held("cpu")}
    del opt
    return held
