"""What makes a step fit when no knob labkit prices does, alone or together: the fewest more nodes of these GPUs
with the smallest layout that then fits (the rollout TP; under Megatron its TP and PP too), else the smallest
larger GPU labkit knows, else a statement that neither does, naming the phase still over.
"""

from __future__ import annotations

from itertools import product

from labkit.config.keys import ACTOR, ROLLOUT
from labkit.config.verl_config import VerlConfig
from labkit.memory.fix_combine import Judge, Price, Short
from labkit.memory.fix_scale import vllm_splits
from labkit.memory.gpus import gpu_names
from labkit.memory.headroom import gpu_settings
from labkit.memory.phase_records import Phase
from labkit.memory.settings import MemorySettings

MORE_NODES = (1, 2, 4, 8, 16, 32, 64)
MAX_TRIES = 160
"""Layouts priced at most (each ~1 ms); the search stops at the first that fits."""
ROLLOUT_TP = f"{ROLLOUT}.tensor_model_parallel_size"
MEG = f"{ACTOR}.megatron"


def way_out(cfg: VerlConfig, s: MemorySettings, price: Price, short: Short, accepted: Judge) -> str:
    """One line: what would make every phase fit (and whether verl's batch rules then need larger batches)."""
    nodes, per_node = cfg.get("trainer.nnodes"), cfg.get("trainer.n_gpus_per_node")
    last: tuple[MemorySettings, dict[str, Phase]] = (s, {})
    tries = 0
    for k in MORE_NODES:
        for layout in _layouts(cfg, s, nodes * k * per_node):
            change = {"trainer.nnodes": nodes * k, **layout}
            new_cfg, new_s, new_phases = price({key: v for key, v in change.items() if v != cfg.get(key)})
            last, tries = (new_s, new_phases), tries + 1
            if not any(short(new_s, p) for p in new_phases.values()):
                rules = "" if accepted(new_cfg) else "; verl's batch rules then need larger batch sizes (labkit check)"
                sizes = ", ".join(f"{key}={v}" for key, v in change.items())
                return f"{new_s.world_size:,} GPUs like these ({sizes}){rules}"
            if tries >= MAX_TRIES:
                break
        if tries >= MAX_TRIES:
            break
    capacities = sorted((gpu_settings(cfg.geometry, name)["gpu_bytes"], name) for name in gpu_names())
    for capacity, name in (c for c in capacities if c[0] > s.gpu_bytes):
        _, new_s, new_phases = price({"gpu_bytes": capacity})
        if not any(short(new_s, p) for p in new_phases.values()):
            return f"the same {s.world_size:,} GPUs with {capacity / 2**30:,.0f} GiB each ({name})"
    new_s, new_phases = last
    over = [(n, p.peak_bytes) for n, p in new_phases.items() if short(new_s, p)]
    where = f"; at {new_s.world_size:,} GPUs {over[0][0]} still needs {over[0][1] / 2**30:,.1f} GiB" if over else ""
    return (
        f"neither more GPUs like these nor a larger GPU labkit knows{where}: a smaller model, shorter sequences or "
        "another layout"
    )


def _layouts(cfg: VerlConfig, s: MemorySettings, world: int) -> list[dict[str, int]]:
    """The layouts worth pricing on ``world`` GPUs, smallest first: the rollout TP vLLM can split the model over,
    and under Megatron its TP (heads divide) and PP (layers divide) as well."""
    m = s.model
    rollout = [t for t in (s.rollout_tp * 2**i for i in range(7)) if world % t == 0 and vllm_splits(m, t)]
    if cfg.get(f"{ACTOR}.strategy") != "megatron":
        return [{ROLLOUT_TP: t} for t in rollout]
    tp, pp, cp = (cfg.get(f"{MEG}.{k}_parallel_size") for k in ("tensor_model", "pipeline_model", "context"))
    sizes = [
        (a, b)
        for a, b in product((tp * 2**i for i in range(4)), (pp * 2**j for j in range(4)))
        if world % (a * b * cp) == 0 and vllm_splits(m, a) and m.num_hidden_layers % b == 0
    ]
    sizes.sort(key=lambda size: size[0] * size[1])
    return [
        {ROLLOUT_TP: t, f"{MEG}.tensor_model_parallel_size": a, f"{MEG}.pipeline_model_parallel_size": b}
        for a, b in sizes
        for t in rollout
    ]
