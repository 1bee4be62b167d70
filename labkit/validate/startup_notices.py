"""What verl prints or silently ignores at start-up outside ``validate_config``, as rules: ``main_ppo.main``'s
warning about the deprecated v0 loop (N7), the engine workers' unread ``nccl_timeout`` (S7), the Megatron
engine's unread ``enable_gradient_checkpointing`` (S8), every other key the config sets that the run's verl never
reads (S9, from the audit in ``data/unread_keys.yaml``) and a Ulysses size that never reaches a model's gated delta-net
or Mamba layers (S10). ``startup`` lists them after validate_config's checks.
"""

from __future__ import annotations

from labkit.config.unread_keys import audit_entry, describe, never_read, sp_unsplit_mixers
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


NAMED_ELSEWHERE = {"trainer.balance_batch", *NCCL_TIMEOUT_KEYS, "actor_rollout_ref.model.enable_gradient_checkpointing"}
"""Unread keys S5, S7 and S8 name with their own story."""


@rule("S9", when=ALWAYS)
def keys_never_read(rec: Recorder, s: Snap) -> None:
    """Each key the config sets that no code of the run's verl release, loop and engine reads (the audit's)."""
    cfg, path = s.run.config, s.run.audit_path
    for table in (cfg.values, cfg.ignored, cfg.added):
        for key, value in table.items():
            why = never_read(key, path) if key not in NAMED_ELSEWHERE else None
            if why is None:
                continue
            where = audit_entry(key, path).where
            rec.add(True, "S9", None, message("S9", key=key, verl=describe(path)), STARTUP, where,
                    [f"{key} = {value}"], why, SILENT, role="trainer")  # fmt: skip


MIXER_NAMES = {"linear_attention": "gated delta-net (linear attention)", "mamba": "Mamba2"}
SP_KEYS = (
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
)
"""The Ulysses sizes of the roles that run the actor's model (the critic may load another)."""


@rule("S10", when=ALWAYS)
def ulysses_misses_sequence_mixers(rec: Recorder, s: Snap) -> None:
    """verl slices every sequence across the SP group before the model and patches only flash attention (and, in
    0.9.1, Qwen3.5's gated delta-net): any other sequence mixer runs over one rank's shard alone."""
    path = s.run.audit_path
    unsplit = sp_unsplit_mixers(path, s.model_type, s.sequence_mixers)
    for key, sp in zip(SP_KEYS, (s.ulysses_sp, s.ref_ulysses_sp)):
        fired = bool(unsplit) and (sp or 1) > 1 and (key == SP_KEYS[0] or s.need_ref)
        mixers = " and ".join(MIXER_NAMES.get(m, m) for m in unsplit)
        rec.add(fired, "S10", None,
                message("S10", key=key, sp=sp, verl=describe(path) if path else "", model_type=s.model_type,
                        mixers=mixers) if fired else "",
                STARTUP, "verl/models/transformers/monkey_patch.py: apply_monkey_patch",
                [f"{key} = {sp}", f"model_type = {s.model_type}: {mixers} layers"],
                f"verl slices each sequence into {sp} shards before the model; only the attention layers gather it "
                "back (all-to-all over heads). The other sequence mixers run their recurrence over one rank's shard "
                "alone, so every token after the first shard sees a truncated history: the loss and gradients are "
                "wrong, and no error says so. Memory is that of the sharded run. Fix: "
                f"{key}=1, or a verl whose Ulysses patch covers {s.model_type}.",
                SILENT, role="ref" if "ref" in key else "actor")  # fmt: skip
