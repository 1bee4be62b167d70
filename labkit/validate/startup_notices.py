"""What verl prints or silently ignores at start-up outside ``validate_config``, as rules: ``main_ppo.main``'s
warning about the deprecated v0 loop (N7), the engine workers' unread ``nccl_timeout`` (S7) and the Megatron
engine's unread ``enable_gradient_checkpointing`` (S8). ``startup`` lists them after validate_config's checks.
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.validate.rulebook import ALWAYS, ENGINE, MEGATRON, rule
from labkit.validate.snapshot import NOTICE, SILENT, STARTUP, Recorder, Snap

NCCL_TIMEOUT_KEYS = ("actor_rollout_ref.nccl_timeout", "critic.nccl_timeout")
"""Keys users raise to cure a hang that verl 0.9.1's engine workers never read."""


@rule("N7")
def v0_loop_deprecated(rec: Recorder, s: Snap) -> None:
    """main_ppo.main, after validate_config: the only switch between the two 0.9.x loops (0.8.0 has one)."""
    release = s.cfg.release
    rec.add(
        s.geo.loop == "v0" and (release is None or release.use_v1 is not False),
        "N7",
        None,
        message("N7"),
        STARTUP,
        "verl/trainer/main_ppo.py: main",
        ["trainer.use_v1 = false"],
        "verl 0.9.1 warns that its v0 loop (RayPPOTrainer) is deprecated; labkit models it with trainer.use_v1=false.",
        NOTICE,
        role="trainer",
    )


@rule("S7", when=ALWAYS)
def nccl_timeout_unread(rec: Recorder, s: Snap) -> None:
    """Engine workers build their process group with timeout=None: nothing reads the key (recorded as passed on
    the legacy profile, whose workers do read it)."""
    timeouts = [k for k in NCCL_TIMEOUT_KEYS if k in s.cfg.ignored or k in s.cfg.added]
    rec.add(
        ENGINE(s) and bool(timeouts),
        "S7",
        None,
        message("S7", keys=", ".join(timeouts)),
        STARTUP,
        "verl/workers/engine_workers.py: __init__ (initialize_global_process_group_ray(timeout_second=None))",
        [f"{k} = {s.cfg.ignored.get(k, s.cfg.added.get(k))}" for k in timeouts],
        "verl 0.9.1's engine workers start torch.distributed with timeout=None (torch's default, 10 minutes for "
        "NCCL) and never read nccl_timeout; CriticConfig only declares it. The legacy workers (0.7.1) passed it to "
        "init_process_group.",
        SILENT,
        role="trainer",
    )


@rule("S8", when=ALWAYS)
def megatron_ignores_checkpointing(rec: Recorder, s: Snap) -> None:
    """The Megatron engine takes recompute from override_transformer_config only (recorded as passed for FSDP)."""
    checkpointing = "actor_rollout_ref.model.enable_gradient_checkpointing"
    granularity = "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity"
    rec.add(
        MEGATRON(s) and s.cfg.is_set(checkpointing) and bool(s.cfg.get(checkpointing)),
        "S8",
        None,
        message("S8"),
        STARTUP,
        "verl/workers/engine/megatron/transformer_impl.py (the key is read by the FSDP engine only)",
        [f"{checkpointing} = true", f"megatron.override_transformer_config.recompute_granularity = "
         f"{s.cfg.get(granularity)}"],
        "The Megatron engine never reads model.enable_gradient_checkpointing: activations are recomputed only as "
        "override_transformer_config.recompute_granularity/method/num_layers say.",
        SILENT,
        role="actor",
    )  # fmt: skip
