"""A trace of megatron-core's own ``GPTModel`` on one pipeline stage, on fake CUDA tensors with a fake process group:
the witness of ``labkit.memory.megatron_memory`` (what one GPU of verl's Megatron backend holds per stage).

megatron-core 0.16.1 (the oracle beside the venv, ``.oracle/megatron-core-0.16.1``) builds one rank's shard of the
model under ``torch.distributed``'s ``fake`` backend at world size TP·PP·CP·DP (``parallel_state.
initialize_model_parallel``; this process is the first rank of pipeline stage ``stage``), with its local layer spec
and the stand-ins of ``labkit.model.trace_megatron_parts`` (TE's fused RMSNorm, flash attention). As verl wraps it
(``verl/utils/megatron_utils.py: get_model``): ``Float16Module`` (the last stage's output upcast to fp32), then, for a
training pass, megatron-core's ``DistributedDataParallel`` with ``grad_reduce_in_fp32=True`` (the fp32 grad buffer
and the bf16 param buffer, as built). The pass runs megatron-core's own pipeline schedule
(``megatron/core/pipeline_parallel/schedules.py: get_forward_backward_func``) over ``micro_batches`` micro-batches
of ``tokens`` tokens (per GPU, after the CP split), with verl's head on the last stage
(``labkit.model.trace_megatron_parts.lm_head``); a forward-only pass (log-prob, ref) under ``torch.no_grad``.
Storages are counted op by op as ``labkit.model.memory_trace`` counts them (512-byte blocks); the peak is above the
model states. The optimizer states are read off the DDP buffers: each buffer's numel over its own data-parallel group
(``param_and_grad_buffer.py: _ParamAndGradBuffer.data_parallel_world_size``: DP·CP for dense, expert DP for
experts), 12 bytes each (``distrib_optimizer.py``: fp32 main param, exp_avg, exp_avg_sq).

Run in a fresh process (``python -m labkit.model.trace_megatron`` with a JSON list of specs on stdin): the fake CUDA
hooks must load before torch, and megatron-core's parallel state is global (one spec per process).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ORACLE = Path(__file__).resolve().parents[2] / ".oracle" / "megatron-core-0.16.1"


def _config(shape: dict[str, Any], spec: dict[str, Any]) -> Any:
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp, moe = spec["tp"], shape.get("moe")
    extra: dict[str, Any] = {}
    if moe:
        extra = {
            "num_moe_experts": moe["num_experts"],
            "moe_router_topk": moe["num_experts_per_tok"],
            "moe_ffn_hidden_size": moe["moe_intermediate_size"],
            "moe_shared_expert_intermediate_size": moe["shared_expert_intermediate_size"] or None,
            "moe_shared_expert_gate": bool(moe["shared_expert_gate"]),
            "moe_token_dispatcher_type": "alltoall",
            "moe_expert_capacity_factor": 1.0,  # fixed shapes: every expert gets its share of top-k tokens
            "moe_pad_expert_input_to_capacity": True,
            "moe_router_load_balancing_type": "none",
        }
    rc = spec.get("recompute") or {}
    return TransformerConfig(
        num_layers=shape["num_hidden_layers"],
        hidden_size=shape["hidden_size"],
        num_attention_heads=shape["num_attention_heads"],
        num_query_groups=shape["num_key_value_heads"],
        kv_channels=shape["head_dim"],
        ffn_hidden_size=shape["intermediate_size"],
        add_qkv_bias=shape["attention_bias"],
        qk_layernorm=shape["qk_norm"],
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=spec["pp"],
        virtual_pipeline_model_parallel_size=spec.get("vpp"),
        context_parallel_size=spec["cp"],
        expert_model_parallel_size=spec.get("ep", 1),
        expert_tensor_parallel_size=spec.get("etp") or tp,
        sequence_parallel=tp > 1,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        bf16=True,
        bias_activation_fusion=True,  # as verl's converters set it (``verl/models/mcore/config_converter.py``)
        bias_dropout_fusion=True,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        normalization="RMSNorm",
        add_bias_linear=False,
        perform_initialization=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        variable_seq_lengths=False,
        recompute_granularity=rc.get("granularity"),
        recompute_method=rc.get("method"),
        recompute_num_layers=rc.get("num_layers"),
        recompute_modules=rc.get("modules") or ["core_attn"],
        **extra,
    )


def _build(shape: dict[str, Any], spec: dict[str, Any], config: Any) -> list[Any]:
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.module import Float16Module

    layer = get_gpt_layer_local_spec(
        num_experts=shape["moe"]["num_experts"] if shape.get("moe") else None,
        qk_layernorm=shape["qk_norm"],
        normalization="RMSNorm",
    )
    chunks = []
    for v in range(spec.get("vpp") or 1):
        vp = v if spec.get("vpp") else None
        with torch.device("cuda"):
            model = GPTModel(
                config,
                layer,
                vocab_size=shape["vocab_size"],
                max_sequence_length=2**20,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                share_embeddings_and_output_weights=shape["tie_word_embeddings"],
                position_embedding_type="rope",
                vp_stage=vp,
            )
        model.bfloat16 = lambda: model  # already bf16 (params_dtype); fake tensors cannot be swapped in place
        chunks.append(Float16Module(config, model))
    return chunks


def _wrap_ddp(chunks: list[Any], config: Any, distributed_optimizer: bool) -> tuple[list[Any], dict[str, int]]:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=distributed_optimizer
    )
    wrapped = [
        DistributedDataParallel(config, ddp_config, chunk, disable_bucketing=i > 0) for i, chunk in enumerate(chunks)
    ]
    states = {"param_buffer": 0, "grad_buffer": 0, "optimizer": 0}
    for ddp in wrapped:
        for buf in [*ddp.buffers, *ddp.expert_parallel_buffers]:
            n = buf.grad_data.numel()
            states["param_buffer"] += buf.param_data.numel() * buf.param_data.element_size()
            states["grad_buffer"] += n * buf.grad_data.element_size()
            shards = buf.data_parallel_world_size if distributed_optimizer else 1
            states["optimizer"] += 12 * n // shards
    return wrapped, states


def trace_stage(shape: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Trace pipeline stage ``spec["stage"]`` of ``shape`` (a ``ModelShape``'s fields, MoE ones optional): ``tp``,
    ``pp``, ``vpp``, ``cp``, ``dp``, ``ep``, ``etp``, ``tokens`` (per GPU and micro-batch, after the CP split),
    ``micro_batches``, ``forward_only``, ``entropy``, ``recompute`` ({granularity, method, num_layers, modules}),
    ``distributed_optimizer``. Returns the model states (bytes) and the pass's peak above them."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    sys.path.insert(0, str(ORACLE))
    from labkit.model.trace_megatron_patches import patch_megatron

    patch_megatron()
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from labkit.model.trace_megatron_parts import StorageMeter, lm_head

    tp, pp, cp, dp = spec["tp"], spec["pp"], spec["cp"], spec["dp"]
    world = tp * pp * cp * dp
    dist.init_process_group("fake", store=FakeStore(), rank=spec["stage"] * world // pp, world_size=world)
    ps.initialize_model_parallel(
        tp,
        pp,
        virtual_pipeline_model_parallel_size=spec.get("vpp"),
        context_parallel_size=cp,
        expert_model_parallel_size=spec.get("ep", 1),
        expert_tensor_parallel_size=spec.get("etp") or tp,
        create_gloo_process_groups=False,
    )
    config = _config(shape, spec)
    forward_only, tokens = bool(spec.get("forward_only")), spec["tokens"]
    with FakeTensorMode(allow_non_fake_inputs=True):
        chunks = _build(shape, spec, config)
        n_params = sum(p.numel() for c in chunks for p in c.parameters())
        states = {"param_buffer": 2 * n_params, "grad_buffer": 0, "optimizer": 0}
        if not forward_only:
            chunks, states = _wrap_ddp(chunks, config, spec.get("distributed_optimizer", True))
        tracker = StorageMeter()
        for c in chunks:
            for t in [*c.parameters(), *torch.nn.Module.buffers(c)]:
                tracker.before.add(t.untyped_storage()._cdata)
        for ddp in chunks if not forward_only else []:
            for buf in [*ddp.buffers, *ddp.expert_parallel_buffers]:
                tracker.before |= {buf.grad_data.untyped_storage()._cdata, buf.param_data.untyped_storage()._cdata}

        def batches() -> Any:
            while True:
                ids = torch.zeros(1, tokens, dtype=torch.long, device="cuda")
                yield ids, torch.arange(tokens, device="cuda")[None]

        def step(data: Any, model: Any) -> Any:
            ids, pos = next(data)
            out = model(ids, pos, None)

            def loss(logits: Any) -> Any:
                res = lm_head(logits, ids, spec.get("temperature", 1.0), bool(spec.get("entropy")))
                total = res["log_probs"].sum() + (res["entropy"].sum() if "entropy" in res else 0)
                return total, {"loss": total.detach()}

            return out, loss

        vpp = spec.get("vpp") or 1
        with tracker, torch.set_grad_enabled(not forward_only):
            if spec["micro_batches"]:  # 0: no pass, the optimizer's step alone (on zero gradients)
                get_forward_backward_func()(
                    forward_step_func=step,
                    data_iterator=[batches() for _ in range(vpp)] if vpp > 1 else batches(),
                    model=chunks if vpp > 1 else chunks[0],
                    num_microbatches=spec["micro_batches"],
                    seq_length=tokens * cp,
                    micro_batch_size=1,
                    forward_only=forward_only,
                )
        if spec.get("optimizer") is not None and not forward_only:  # one step of megatron-core's own optimizer
            from labkit.model.trace_megatron_optimizer import traced_optimizer

            states.update(traced_optimizer(chunks, spec["optimizer"]))
    top = sorted(tracker.at_peak.items(), key=lambda kv: -kv[1][1])[:24]
    return {**states, "params": n_params, "peak_bytes": tracker.peak, "op": tracker.peak_op, "alive": top}


def _teardown() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    dist.destroy_process_group()


def main() -> None:
    """A JSON list of specs (``{"model": fields, ...trace_stage options}``) on stdin, traced one after the other in
    this process (megatron's parallel state torn down between them); prints the results as one JSON list."""
    from labkit.model import fake_cuda

    fake_cuda.enable()
    out = []
    for spec in json.loads(sys.stdin.read()):
        shape = spec.pop("model")
        try:
            out.append(trace_stage(shape, spec))
        except Exception as exc:  # one failed spec does not lose the others
            import traceback

            where = [f"{f.filename.rsplit('/', 3)[-1]}:{f.lineno}" for f in traceback.extract_tb(exc.__traceback__)][
                -6:
            ]
            out.append({"error": f"{type(exc).__name__}: {str(exc)[:200]} at {where}"})
        finally:
            _teardown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
