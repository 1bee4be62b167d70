"""The training engine's parallel layout: how W GPUs are cut into tensor, context, expert, data and pipeline groups.

FSDP (``model_engine=dp``): D = W // Ulysses sp; VeOmni (``model_engine=veomni``) the same, with its own Ulysses
size and expert parallelism (``verl/workers/engine/veomni/transformer_impl.py: VeOmniEngine.get_data_parallel_size``). Megatron (``model_engine=megatron``, legacy ``strategy=megatron``):
megatron-core's layout, D = W // (TP·PP·CP), expert DP = W // (ETP·EP·PP), ranks ordered ``tp-cp-ep-dp-pp`` (the
first varies fastest). Mirrors ``megatron/core/parallel_state.py: initialize_model_parallel`` (the sizes) and
``verl/workers/engine/megatron/transformer_impl.py: MegatronEngine.get_data_parallel_size``. Read once per answer
(``ParallelLayout.from_config``) and carried by the batch geometry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.config.keys import ACTOR, ARR
from labkit.rules.pipeline_layout import layout_vpp

FSDP, MEGATRON, VEOMNI = "fsdp", "megatron", "veomni"
MEGATRON_SIZE_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)


def engine_of(cfg: Any) -> str:
    """``megatron`` or ``veomni`` when the actor trains with that engine (``model_engine=…`` or
    ``actor.strategy=…``), else ``fsdp``."""
    strategy = cfg.get(f"{ACTOR}.strategy")
    return strategy if strategy in (MEGATRON, VEOMNI) else FSDP


@dataclass(frozen=True)
class ParallelLayout:
    """The sizes of one training engine's process groups on W GPUs (all 1 where the engine has no such group)."""

    engine: str
    """``fsdp``, ``megatron`` or ``veomni`` (FSDP's layout plus expert parallelism)."""
    world_size: int
    """W, the GPUs of the actor's pool."""
    ulysses_sp: int = 1
    """FSDP: the actor's Ulysses sequence-parallel size (1 under Megatron, which has none)."""
    tp: int = 1
    """Megatron: ``tensor_model_parallel_size``."""
    pp: int = 1
    """Megatron: ``pipeline_model_parallel_size``."""
    vpp: int | None = None
    """Megatron: ``virtual_pipeline_model_parallel_size`` (None: no interleaving)."""
    cp: int = 1
    """Megatron: ``context_parallel_size``."""
    ep: int = 1
    """Megatron: ``expert_model_parallel_size``."""
    etp: int = 1
    """Megatron: ``expert_tensor_parallel_size`` (None in the config means TP)."""
    sequence_parallel: bool = False
    """Megatron: sequence parallel as built (verl turns it off at TP = 1)."""
    use_distributed_optimizer: bool = False
    """Megatron: the optimizer state sharded over DP·CP."""
    dynamic_context_parallel: bool = False
    """Megatron: dynamic CP (verl then reports DP = 1 to the trainer)."""
    first_stage_layers: int | None = None
    """Megatron uneven PP: ``num_layers_in_first_pipeline_stage`` (None: an even split)."""
    last_stage_layers: int | None = None
    """Megatron uneven PP: ``num_layers_in_last_pipeline_stage`` (None: an even split)."""
    pipeline_layout: str | None = None
    """Megatron's custom ``pipeline_model_parallel_layout`` (``labkit.rules.pipeline_layout``; None: none)."""
    split_slots: int = 0
    """Megatron's ``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``: layer slots
    the embedding (first virtual stage) and the loss (last) take in the split (0, 1 or 2)."""
    embedding_slot: bool = False
    """The embedding takes a layer slot of the first virtual stage (``account_for_embedding_in_pipeline_split``)."""

    @property
    def is_megatron(self) -> bool:
        return self.engine == MEGATRON

    @property
    def model_parallel_size(self) -> int:
        """TP·PP (verl's ``model_parallel_size``); 1 under FSDP."""
        return self.tp * self.pp

    @property
    def dp_divisor(self) -> int:
        """What D divides W by: Ulysses sp (FSDP) or TP·PP·CP (Megatron)."""
        return self.ulysses_sp if not self.is_megatron else self.tp * self.pp * self.cp

    @property
    def dp_size(self) -> int:
        """D, the data-parallel ranks (0 when the divisor does not divide W: torch or megatron-core stops)."""
        d = self.dp_divisor
        return self.world_size // d if self.world_size % d == 0 else 0

    @property
    def trainer_dp_size(self) -> int:
        """The DP size the trainer dispatches over: D, or 1 under dynamic CP (every DP×CP rank gets the batch)."""
        return 1 if self.dynamic_context_parallel and self.dp_size else self.dp_size

    @property
    def expert_dp_size(self) -> int:
        """Megatron's expert DP = W // (ETP·EP·PP) (CP folds into it), 0 when that does not divide W."""
        d = self.etp * self.ep * self.pp
        return self.world_size // d if self.world_size % d == 0 else 0

    @property
    def token_budget_scale(self) -> int:
        """What a ``*_max_token_len_per_gpu`` budget is multiplied by: Ulysses sp (FSDP) or CP (Megatron)."""
        return self.cp if self.is_megatron else self.ulysses_sp

    @classmethod
    def from_config(cls, cfg: Any, role: str = "actor") -> ParallelLayout:
        """The layout of ``role`` (actor, ref or critic) read from ``cfg`` once. Under Megatron verl builds one
        layout per process from the first engine (``_init_device_mesh`` returns if mpu is initialised), so the actor's
        sizes are the ones every colocated role runs with."""
        g, world = cfg.get, cfg.n_gpus
        engine = engine_of(cfg)
        if engine == VEOMNI:  # FSDP2 with Ulysses and expert parallelism: DP = W // Ulysses (VeOmniEngine)
            prefix = "critic" if role == "critic" else f"{ARR}.{role}"
            sp, ep = g(f"{prefix}.veomni.ulysses_parallel_size"), g(f"{prefix}.veomni.expert_parallel_size")
            return cls(VEOMNI, world, ulysses_sp=sp, ep=ep)
        if engine != MEGATRON:
            prefix = "critic" if role == "critic" else f"{ARR}.{role}"
            return cls(FSDP, world, ulysses_sp=g(f"{prefix}.ulysses_sequence_parallel_size"))
        m = f"{ACTOR}.megatron"
        tp, pp, vpp, cp, ep, etp = (g(f"{m}.{k}") for k in MEGATRON_SIZE_KEYS)
        pipeline = g(f"{m}.override_transformer_config.pipeline_model_parallel_layout")
        if pipeline is not None and vpp is None:  # TransformerConfig takes the VPP a custom layout implies
            vpp = layout_vpp(pipeline, pp)
        return cls(
            MEGATRON,
            world,
            tp=tp,
            pp=pp,
            vpp=vpp,
            cp=cp,
            ep=ep,
            etp=tp if etp is None else etp,
            sequence_parallel=bool(g(f"{m}.sequence_parallel")) and tp > 1,
            use_distributed_optimizer=bool(g(f"{m}.use_distributed_optimizer")),
            dynamic_context_parallel=bool(g(f"{m}.dynamic_context_parallel")),
            first_stage_layers=g(f"{m}.override_transformer_config.num_layers_in_first_pipeline_stage"),
            last_stage_layers=g(f"{m}.override_transformer_config.num_layers_in_last_pipeline_stage"),
            pipeline_layout=pipeline,
            split_slots=int(_flag(cfg, f"{m}.override_transformer_config.account_for_embedding_in_pipeline_split"))
            + int(_flag(cfg, f"{m}.override_transformer_config.account_for_loss_in_pipeline_split")),
            embedding_slot=_flag(cfg, f"{m}.override_transformer_config.account_for_embedding_in_pipeline_split"),
        )


def _flag(cfg: Any, key: str) -> bool:
    """A boolean ``override_transformer_config`` field verl passes through to megatron-core (set with ``+``)."""
    return str(cfg.raw(key, False)).strip().lower() in ("true", "1")
