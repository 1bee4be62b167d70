"""The FSDP workers' Ulysses checks at worker init: the (dp, sp) device mesh must cover the world (X4) and the
attention heads must split over sp (E41/E42, ``verl/models/transformers/monkey_patch.py: apply_monkey_patch``).
Both profiles run them per role; the engine's ref and actor rules are here, the legacy workers' in
``legacy_workers``.
"""

from __future__ import annotations

from labkit.validate.rulebook import ENGINE, FSDP, REF_ENGINE, rule
from labkit.validate.snapshot import AE, ENGINE_W, INIT, Recorder, Snap, mod

INIT_MODEL = f"{ENGINE_W}: ActorRolloutRefWorker.init_model"


def mesh_check(rec: Recorder, s: Snap, sp: int, where: str, role: str) -> bool:
    """X4: the Ulysses (dp, sp) device mesh needs W % sp == 0; returns True when it fails."""
    return rec.add(
        sp > 1 and s.world_size % sp != 0,
        "X4",
        "RuntimeError",
        f"torch init_device_mesh(mesh_shape=({s.world_size // sp}, {sp}), mesh_dim_names=['dp', 'sp']) cannot cover "
        f"a world of {s.world_size} ranks (exact text depends on the torch version)",
        INIT,
        where,
        [mod(s.world_size, sp)] if sp > 1 else [f"sp = {sp}: no Ulysses mesh"],
        f"The {role} Ulysses mesh is (W // sp, sp); W must be a multiple of sp.",
        role=role,
    )


def heads_check(rec: Recorder, s: Snap, sp: int, role: str) -> None:
    """E41/E42: mirrors verl/models/transformers/monkey_patch.py: apply_monkey_patch head asserts."""
    where = "verl/models/transformers/monkey_patch.py: apply_monkey_patch"
    if s.heads is not None:
        rec.add(
            s.heads % sp != 0,
            "E41",
            AE,
            f"num_attention_heads {s.heads} must be divisible by ulysses_sp_size {sp}",
            INIT,
            where,
            [mod(s.heads, sp)],
            "Ulysses scatters attention heads over the sp ranks.",
            role=role,
        )
    if s.kv_heads is not None:
        kv = s.kv_heads
        rec.add(
            kv % sp != 0 and sp % kv != 0,
            "E42",
            AE,
            f"num_key_value_heads {kv} must be divisible by ulysses_sp_size {sp}or vise versa. "
            "Upon ulysses_sp_size % num_key_value_heads == 0,kv heads are repeated to ensure correctness.",
            INIT,
            where,
            [mod(kv, sp), mod(sp, kv)],
            "KV heads are split over sp, or repeated when sp is a multiple.",
            role=role,
        )


@rule("X4 E41 E42", when=ENGINE & FSDP & REF_ENGINE)
def engine_ref_ulysses(rec: Recorder, s: Snap, norm: dict) -> None:
    """The ref's engine is built first: its Ulysses mesh, then (when the mesh is built) its heads."""
    if not mesh_check(rec, s, s.ref_ulysses_sp, INIT_MODEL, "ref"):
        heads_check(rec, s, s.ref_ulysses_sp, "ref")


@rule("X4 E41 E42", when=ENGINE & FSDP)
def engine_actor_ulysses(rec: Recorder, s: Snap, norm: dict) -> None:
    """The actor's engine: its Ulysses mesh, then (when the mesh is built) its heads."""
    if not mesh_check(rec, s, s.ulysses_sp, INIT_MODEL, "actor"):
        heads_check(rec, s, s.ulysses_sp, "actor")
