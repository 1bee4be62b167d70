"""Which decoder layers each pipeline stage of megatron-core builds (even, uneven first/last, the embedding and loss
counted as layers, a custom ``pipeline_model_parallel_layout``; virtual stages interleaved) and which of them hold a
sparse MLP. Shared by the Megatron parameters, activations and LoRA adapters of ``labkit.memory.megatron_memory``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from labkit.memory.shapes import ModelShape
from labkit.rules.parallel_layout import ParallelLayout
from labkit.rules.pipeline_layout import layout_error, layout_layers


def moe_of(m: ModelShape) -> Any:
    """The model's sparse MLP shape (``labkit.memory.shapes_moe.MoeShape``), or None when dense."""
    return getattr(m, "moe", None)


def is_moe_layer(m: ModelShape, index: int) -> bool:
    """Layer ``index`` holds the sparse MLP (False for dense models)."""
    f = getattr(m, "is_moe_layer", None)
    return bool(f(index)) if f else False


def stage_layers(m: ModelShape, layout: ParallelLayout, stage: int) -> tuple[tuple[int, ...], ...]:
    """The decoder layers of ``stage``, one tuple per model chunk: virtual stage c·PP + r holds
    L/(PP·V) consecutive layers; with ``num_layers_in_first/last_pipeline_stage`` the first/last stage holds that many
    and the rest split evenly (``megatron/core/transformer/transformer_block.py: get_num_layers_to_build``); a custom
    ``pipeline_model_parallel_layout`` places them as it says (``labkit.rules.pipeline_layout``)."""
    if layout.pipeline_layout is not None:
        error = layout_error(layout.pipeline_layout, layout.pp, layout.vpp, m.num_hidden_layers)
        if error:
            raise ValueError(error)
        return layout_layers(layout.pipeline_layout, layout.pp, stage)
    first, last = layout.first_stage_layers, layout.last_stage_layers
    if first is None and last is None and layout.split_slots:
        return _slotted_layers(
            m.num_hidden_layers, layout.pp, layout.vpp or 1, stage, layout.embedding_slot, layout.split_slots
        )
    if first is None and last is None:
        return _stage_layers(m.num_hidden_layers, layout.pp, layout.vpp or 1, stage)
    return _uneven_layers(m.num_hidden_layers, layout.pp, layout.vpp or 1, stage, first, last)


@lru_cache(maxsize=1024)
def _uneven_layers(total: int, pp: int, v: int, stage: int, first: int | None, last: int | None) -> tuple:
    if v > 1:
        raise ValueError("uneven pipeline stages with virtual pipeline stages are not priced")
    left, stages = total - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
    if left < 0 or (stages > 0 and left % stages) or (stages == 0 and left):
        raise ValueError(
            f"num_layers ({total}) cannot be split as first {first}, last {last} over {pp} pipeline stages"
        )
    counts = [left // stages if stages else 0] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    start = sum(counts[:stage])
    return (tuple(range(start, start + counts[stage])),)


@lru_cache(maxsize=1024)
def _slotted_layers(total: int, pp: int, v: int, stage: int, embedding: bool, slots: int) -> tuple:
    """The even split with the embedding and/or the loss counted as a layer (megatron-core's
    ``get_num_layers_to_build``): (L + slots)/(PP·V) per virtual stage, one fewer where the embedding (first) or the
    loss (last virtual stage) sits; layers are laid out in virtual-stage order."""
    counts = _stage_layers(total + slots, pp, v, 0)  # raises like megatron-core when the split is uneven
    per = len(counts[0])
    sizes = [per] * (pp * v)
    if embedding:
        sizes[0] -= 1
    if slots - embedding:
        sizes[-1] -= 1
    if min(sizes) < 0:
        raise ValueError("Not enough layers in the first or last virtual pipeline stage")
    starts = [sum(sizes[:i]) for i in range(pp * v)]
    return tuple(tuple(range(starts[c * pp + stage], starts[c * pp + stage] + sizes[c * pp + stage])) for c in range(v))


@lru_cache(maxsize=1024)
def _stage_layers(total: int, pp: int, v: int, stage: int) -> tuple[tuple[int, ...], ...]:
    if total % (pp * v):
        raise ValueError(
            f"num_layers ({total}) must be divisible by pipeline_model_parallel_size ({pp}) × virtual stages ({v})"
        )
    per = total // (pp * v)
    return tuple(tuple(range((c * pp + stage) * per, (c * pp + stage + 1) * per)) for c in range(v))
