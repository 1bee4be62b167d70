"""Per-GPU memory of verl's Megatron backend, per pipeline stage and phase: pure arithmetic, every term named
(``labkit.memory.megatron_terms.MEGATRON_TERMS``), in the shape of ``labkit.memory.phases.Phase`` (named instants,
each a dict of term -> bytes).

Model states follow megatron-core's DDP and distributed optimizer as verl wraps them
(``megatron/core/distributed/param_and_grad_buffer.py: _ParamAndGradBuffer``, ``distrib_optimizer.py``,
``verl/utils/megatron_utils.py: get_model``; ``grad_reduce_in_fp32=True``): bf16 params 2 B and fp32 main grads 4 B
per parameter on every rank, fp32 main params + Adam m, v (12 B) sharded over DP·CP (experts over expert DP). The
ref is forward_only: 2 B/param. Offload (``megatron_utils.py: offload_megatron_model_to_cpu``,
``offload_megatron_optimizer``): ``param_offload`` keeps params off the GPU outside the model's phases and frees the
grad buffer (an eval phase loads the params only); ``optimizer_offload`` keeps the optimizer off outside the update.

Activations follow megatron-core's layers and schedule (``megatron/core/pipeline_parallel/schedules.py``): stage r
holds the saved tensors of ``in_flight`` micro-batches (chunk-forwards under VPP) over its layers at its peak; a
forward_only pass runs under ``torch.no_grad`` and holds one layer's working set. The last stage adds verl's head
(``transformer_impl.py: MegatronEngine._lm_head_logits_processor`` on Float16Module's fp32 logits). The witness is a
trace of megatron-core's own GPTModel and schedule (``labkit.model.trace_megatron``).
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.memory.megatron_activations import (
    Recompute,
    StageInputs,
    backward_transient,
    forward_working_set,
    head_terms,
    in_flight,
    pass_buffers,
    stage_activations,
)
from labkit.memory.megatron_params import Residency, approximations, check_groups, residents
from labkit.memory.megatron_stages import stage_layers
from labkit.memory.phase_records import Phase
from labkit.memory.shapes import ModelShape
from labkit.rules.parallel_layout import ParallelLayout

__all__ = [
    "PHASES",
    "MegatronMemory",
    "Recompute",
    "Residency",
    "StageInputs",
    "megatron_memory",
    "residents",
    "stage_phase",
]

PHASES = ("old_log_prob", "ref_log_prob", "update_actor", "values", "update_critic")
FORWARD_ONLY = ("old_log_prob", "ref_log_prob", "values")


def stage_phase(
    m: ModelShape, layout: ParallelLayout, stage: int, phase: str, inp: StageInputs, r: Residency | None = None
) -> Phase:
    """One stage's memory in one phase: named instants (``layer_forward`` / ``layer_backward``; on the last stage
    ``lm_head``; in the first stage's update ``embedding_backward``), each a dict of term -> bytes
    (``labkit.memory.megatron_terms.MEGATRON_TERMS``). ValueError (one line) on input megatron-core or verl
    would refuse or that is not modelled."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, not {phase!r}")
    if not 0 <= stage < layout.pp:
        raise ValueError(f"stage must be in 0..{layout.pp - 1}, not {stage}")
    if inp.tokens < 1 or inp.micro_batches < 1:
        raise ValueError("tokens and micro_batches must be positive")
    if layout.sequence_parallel and inp.tokens % layout.tp:
        raise ValueError(
            f"with sequence parallelism a micro-batch's tokens ({inp.tokens}) are a multiple of TP ({layout.tp}): "
            "verl pads each sequence to it"
        )
    check_groups(m, layout.tp)
    inp.recompute.check()
    r = r or Residency()
    forward_only, critic = phase in FORWARD_ONLY, phase in ("values", "update_critic")
    t, last = inp.tokens, stage == layout.pp - 1
    base = {**residents(m, layout, stage, phase, r), **pass_buffers(m, layout, stage, t, forward_only)}
    layers = [i for chunk in stage_layers(m, layout, stage) for i in chunk]
    entropy = phase == "old_log_prob" or (phase == "update_actor" and inp.entropy)
    if forward_only:
        instants = {"layer_forward": {**base, "layer_forward": forward_working_set(m, layout, t, layers)}}
        if last:
            instants["lm_head"] = {**base, **head_terms(m, layout, t, True, entropy, critic)}
    else:
        acts = stage_activations(m, layout, stage, inp)
        instants = {"layer_backward": {**base, **acts, "layer_backward": backward_transient(m, layout, t, layers)}}
        if last:
            instants["lm_head"] = {**base, **acts, **head_terms(m, layout, t, False, entropy, critic)}
        if stage == 0:  # the embedding's backward: this micro-batch's layers are done, its weight gradient is made
            n = max(in_flight(layout, stage, inp.micro_batches), 1)
            rest = {k: v * (n - 1) // n for k, v in acts.items() if k != "recomputed_layers"}
            grad = 2 * -(-m.vocab_size // layout.tp) * m.hidden_size
            instants["embedding_backward"] = {**base, **rest, "embedding_grad": grad}
    info = {"stage": stage, "in_flight": 0 if forward_only else in_flight(layout, stage, inp.micro_batches)}
    if approximations(m):
        info["not_modelled"] = approximations(m)
    return Phase(phase, instants, {**info, "tokens": t, "layers": len(layers)})


@dataclass
class MegatronMemory:
    """Every stage's phases (``phases[stage][phase]``) and the verdict: the highest peak, where, against capacity."""

    phases: dict[int, dict[str, Phase]]
    gpu_bytes: int | None = None

    @property
    def peak(self) -> tuple[int, str, int]:
        """(stage, phase, bytes) of the highest peak over all stages and phases."""
        return max(
            ((s, name, p.peak_bytes) for s, by in self.phases.items() for name, p in by.items()), key=lambda x: x[2]
        )

    @property
    def fits(self) -> bool | None:
        """The highest peak fits the GPU (None without a capacity)."""
        return None if self.gpu_bytes is None else self.peak[2] <= self.gpu_bytes

    def stage_peaks(self) -> list[int]:
        """Each stage's highest peak over its phases."""
        return [max(p.peak_bytes for p in self.phases[s].values()) for s in sorted(self.phases)]


def megatron_memory(
    m: ModelShape,
    layout: ParallelLayout,
    passes: dict[str, StageInputs],
    residency: Residency | None = None,
    gpu_bytes: int | None = None,
) -> MegatronMemory:
    """Every stage (0..PP−1) in every phase of ``passes`` (phase -> its largest micro-batch's tokens, Mμ,
    recompute, entropy), with the verdict against ``gpu_bytes``."""
    if not layout.is_megatron:
        raise ValueError("megatron_memory needs a Megatron layout (model_engine=megatron)")
    r = residency or Residency()
    out = {s: {name: stage_phase(m, layout, s, name, inp, r) for name, inp in passes.items()} for s in range(layout.pp)}
    return MegatronMemory(out, gpu_bytes)
