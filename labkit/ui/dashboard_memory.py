"""The dashboard's memory inputs (labkit.ui.dashboard): a LoRA rank and the share of the optimizer megatron-core's
CPU optimizer holds, as widgets (``memory_inputs``) and as the Hydra overrides they add after the text
(``memory_knobs``)."""

from __future__ import annotations

from typing import Any

OPTIMIZER = "actor_rollout_ref.actor.optim.override_optimizer_config"


def memory_knobs(lora_rank: int, cpu_optimizer_share: float) -> tuple[str, ...]:
    """The overrides of the dashboard's memory inputs, applied after the text: a LoRA rank (0: the text's own), the
    share megatron-core's CPU optimizer holds (0: the text's own; read by the Megatron engine only)."""
    out = (f"actor_rollout_ref.model.lora_rank={lora_rank}",) if lora_rank > 0 else ()
    if cpu_optimizer_share > 0:
        out += (
            f"+{OPTIMIZER}.optimizer_cpu_offload=true",
            f"+{OPTIMIZER}.optimizer_offload_fraction={cpu_optimizer_share}",
        )
    return out


def memory_inputs(style: dict[str, str], layout: Any) -> tuple[Any, Any]:
    """The LoRA rank and CPU optimizer share widgets (ipywidgets), both off (0) at first."""
    import ipywidgets as W

    lora = W.BoundedIntText(
        value=0, min=0, max=1024, description="LoRA rank", tooltip="actor_rollout_ref.model.lora_rank (0: off)",
        style=style, layout=layout,
    )  # fmt: skip
    cpu_optimizer = W.BoundedFloatText(
        value=0.0, min=0.0, max=1.0, step=0.25, description="CPU optim.", style=style, layout=layout,
        tooltip="Megatron: the share of the optimizer megatron-core's CPU optimizer holds (optimizer_offload_fraction)",
    )  # fmt: skip
    return lora, cpu_optimizer
