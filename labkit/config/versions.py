"""verl releases as users name them (``--verl 0.8.0``): which profile, trainer loop and dispatch each one runs, and
where its batch path differs from what labkit models.

The facts come from each release's own code: 0.5.x registers the FSDP workers' data methods with
``Dispatch.DP_COMPUTE_PROTO`` (the all-gather dispatch); 0.6.x and 0.7.x run the legacy ``fsdp_workers.py`` by default
(``trainer.use_legacy_worker_impl=auto``); 0.8.0 ships ``engine_workers.py`` only (no legacy workers, no v1 loop);
0.9.0 adds the v1 loop (``trainer.use_v1: true``). The releases before 0.5 (0.1 as the forks vendor it, 0.2, 0.3,
0.4) run the legacy workers with their own YAML defaults (``data/verl_old_releases.json``) and the memory behaviour
``ReleaseMemory`` records, each read from the release's code. Up to 0.9.0 ``verl/utils/seqlen_balancing.py:
rearrange_micro_batches`` sets the micro-batch count from the token budget and never re-checks it (a micro-batch may
exceed the budget); 0.9.1 grows the count until every micro-batch fits. 0.9.0's synthetic v1 padding rows are 2 tokens
(``verl/trainer/ppo/padding_utils.py``), 0.9.1's 128.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from labkit.config.messages import InputError

OLD_RELEASES = Path(__file__).resolve().parents[2] / "data" / "verl_old_releases.json"


@dataclass(frozen=True)
class ReleaseMemory:
    """What a release's workers did that moves GPU memory, where it differs from 0.5 onwards (each read from the
    release's code; labkit.memory prices them)."""

    entropy_always: bool = False
    """``dp_actor.py: _forward_micro_batch`` returns the full-vocabulary entropy on every call (0.1 to 0.3): the
    actor's and the reference's log-prob forwards compute it and drop it, the update keeps it in the graph whatever
    ``entropy_coeff``. 0.4's ``calculate_entropy`` (#1100) computes it where it is used."""
    ce_inplace_backward: bool = True
    """flash-attn's cross-entropy writes its gradient into the logits (``inplace_backward``, #1212, 0.4); before,
    its backward makes a gradient of the logits' size of its own."""
    ref_always: bool = False
    """``main_ppo`` always maps ``Role.RefPolicy`` and the trainer always runs ``compute_ref_log_prob`` (0.1 to 0.3:
    the KL goes into the loss or the reward); from 0.4 only with ``use_kl_loss`` or ``use_kl_in_reward``."""
    ref_offloaded: bool = True
    """The reference is built under FSDP ``CPUOffload(offload_params=True)`` (from 0.2): its parameters live on the
    CPU. 0.1 as vendored keeps it on the GPU in bf16 unless ``ref.fsdp_config.param_offload``."""
    vllm_share_of_free: bool = False
    """vLLM 0.6.3 through verl's patched worker (``third_party/vllm/vllm_v_0_6_3/worker.py:
    determine_num_available_blocks``): the KV pool is ``gpu_memory_utilization`` × the memory still free once the
    models are loaded and vLLM has profiled, fixed at start-up, before any Adam state exists."""
    actor_in_generate: bool = False
    """``generate_sequences`` loads the actor before the rollout and keeps it on the GPU through generation, even
    with ``param_offload`` (0.1, 0.2; 0.3 with vLLM ≥ 0.7 wakes the engine before it offloads the actor)."""
    micro_times_n: bool = False
    """The deprecated global micro sizes count prompts: the worker divides them by the DP size and multiplies them
    by ``rollout.n`` (verl's main from #80 to #136, January 2025, which the forks vendor)."""
    notes: tuple[str, ...] = field(default=())
    """What the answer says of this release's memory, beyond the flags."""


@dataclass(frozen=True)
class Release:
    """One verl release: the profile and loop labkit models it with, and what differs."""

    version: str
    profile: str
    """``legacy`` or ``engine``."""
    use_v1: bool | None
    """The engine's trainer loop (``trainer.use_v1``); None for the legacy workers (v0 loop)."""
    dispatch: str = "mesh"
    """``mesh`` (nd dispatch, 0.6+) or ``all_gather`` (0.5's DP_COMPUTE_PROTO)."""
    budget_cap: bool = True
    """The engine's dynamic token budget is a hard cap (0.9.1) or only sets the count (0.8.0, 0.9.0)."""
    padding_row_tokens: int = 128
    """Tokens of one synthetic v1 padding row (0.9.1: 128; 0.9.0: 2)."""
    differences: tuple[str, ...] = ()
    """Where this release's batch path differs from what labkit models, said with every answer."""
    memory: ReleaseMemory = ReleaseMemory()
    """What its workers did that moves GPU memory (0.5 onwards: the defaults)."""
    defaults: tuple[tuple[str, Any], ...] = ()
    """YAML defaults of a release from 0.5 that differ from its profile's (0.7.1's or 0.9.1's)."""

    def yaml_default(self, key: str) -> Any:
        """The release's own YAML default of ``key`` (releases before 0.5, and ``defaults``; KeyError otherwise)."""
        own = dict(self.defaults)
        return own[key] if key in own else old_yaml(self.version)[key]

    def has_key(self, key: str) -> bool | None:
        """Whether the release's YAML has ``key`` (None: a release labkit reads from its own key lists, and
        ``key`` is not among its ``defaults``)."""
        if key in dict(self.defaults):
            return True
        table = old_yaml(self.version) if self.version in OLD else None
        return None if table is None else key in table

    @property
    def label(self) -> str:
        loop = "legacy workers" if self.profile == "legacy" else f"engine workers, {'v1' if self.use_v1 else 'v0'} loop"
        return f"verl {self.version} ({loop})"


_LEGACY_ORACLE = "labkit's legacy profile is checked against verl 0.7.1's code"
_VLLM_063 = (
    "gpu_memory_utilization is a share of the memory free after the models loaded (vLLM 0.6.3), sized before any Adam "
    "state exists"
)
_PADDED = (("actor_rollout_ref.model.use_remove_padding", False),)
"""0.5's and 0.6's ppo_trainer.yaml default ``model.use_remove_padding: false`` (0.7 turned it on)."""
OLD = ("0.1", "0.2", "0.3", "0.4")
_OLD_NOTE = "its defaults are its own YAML's (remove padding off); its batch checks are 0.7.1's"


@cache
def old_yaml(version: str) -> dict[str, Any]:
    """The YAML defaults of a release before 0.5 (``data/verl_old_releases.json``)."""
    return json.loads(OLD_RELEASES.read_text())["releases"][version]


RELEASES: dict[str, Release] = {
    "0.1": Release(
        "0.1",
        "legacy",
        None,
        dispatch="all_gather",
        differences=(
            "0.1 is verl's main of January 2025, as TinyZero, Search-R1, DeepScaleR, ToolRL and Logic-RL vendor it "
            "(its version file says 0.1; the v0.1 tag of December 2024 has no remove-padding)",
            _OLD_NOTE,
        ),
        memory=ReleaseMemory(
            entropy_always=True,
            ce_inplace_backward=False,
            ref_always=True,
            ref_offloaded=False,
            vllm_share_of_free=True,
            actor_in_generate=True,
            micro_times_n=True,
            notes=(_VLLM_063, "the reference is resident in bf16 unless ref.fsdp_config.param_offload"),
        ),
    ),
    "0.2": Release(
        "0.2",
        "legacy",
        None,
        dispatch="all_gather",
        differences=(_OLD_NOTE,),
        memory=ReleaseMemory(
            entropy_always=True,
            ce_inplace_backward=False,
            ref_always=True,
            vllm_share_of_free=True,
            actor_in_generate=True,
            notes=(_VLLM_063,),
        ),
    ),
    "0.3": Release(
        "0.3",
        "legacy",
        None,
        dispatch="all_gather",
        differences=(_OLD_NOTE,),
        memory=ReleaseMemory(
            entropy_always=True,
            ce_inplace_backward=False,
            ref_always=True,
            actor_in_generate=True,
            notes=(
                "priced with vLLM 0.8 (gpu_memory_utilization a share of the whole GPU, sleep mode); with vLLM 0.6.3 "
                "0.3 sized the KV pool from the memory left free after the models loaded",
            ),
        ),
    ),
    "0.4": Release(
        "0.4",
        "legacy",
        None,
        dispatch="all_gather",
        differences=(_OLD_NOTE,),
        memory=ReleaseMemory(
            notes=(
                "priced with vLLM 0.8 (gpu_memory_utilization a share of the whole GPU, sleep mode); with vLLM 0.6.3 "
                "0.4 sized the KV pool from the memory left free after the models loaded",
            ),
        ),
    ),
    "0.5": Release(
        "0.5",
        "legacy",
        None,
        dispatch="all_gather",
        differences=(
            "0.5 dispatches with DP_COMPUTE_PROTO (the all-gather dispatch, selected for you)",
            _LEGACY_ORACLE,
        ),
        defaults=_PADDED,
    ),
    "0.6": Release("0.6", "legacy", None, differences=(_LEGACY_ORACLE,), defaults=_PADDED),
    "0.7": Release("0.7", "legacy", None),
    "0.8": Release(
        "0.8",
        "engine",
        False,
        budget_cap=False,
        differences=(
            "0.8.0 has engine workers only and no v1 loop (trainer.use_v1 does not exist; the v0 RayPPOTrainer runs)",
            "its dynamic token budget sets the micro-batch count but is not a cap (modelled)",
        ),
    ),
    "0.9.0": Release(
        "0.9.0",
        "engine",
        True,
        budget_cap=False,
        padding_row_tokens=2,
        differences=(
            "its dynamic token budget sets the micro-batch count but is not a cap (modelled)",
            "its v1 padding rows are 2 tokens, not 128 (modelled)",
            "its v1 replay buffer and trainer code differ from 0.9.1's in ways labkit does not model",
        ),
    ),
    "0.9.1": Release("0.9.1", "engine", True),
}
_ALIASES = {
    "0.1.0": "0.1",
    "0.2.0": "0.2",
    "0.2.0.post1": "0.2",
    "0.2.0.post2": "0.2",
    "0.3.0": "0.3",
    "0.3.0.post0": "0.3",
    "0.3.0.post1": "0.3",
    "0.4.0": "0.4",
    "0.4.1": "0.4",
    "0.5.0": "0.5",
    "0.6.0": "0.6",
    "0.6.1": "0.6",
    "0.7.0": "0.7",
    "0.7.1": "0.7",
    "0.8.0": "0.8",
}


class VersionError(InputError):
    """A verl version labkit does not model."""


def release(text: str) -> Release:
    """The release ``text`` names (``0.8``, ``0.8.0``, ``v0.9.1``); VersionError for one labkit does not model."""
    key = re.sub(r"^v", "", str(text).strip()).removesuffix(".rc0")
    key = _ALIASES.get(key, key)
    if key not in RELEASES:
        known = ", ".join(RELEASES)
        raise VersionError(f"--verl {text}: labkit models verl {known} (and their point releases, e.g. 0.3.0.post1)")
    return RELEASES[key]


def resolve(profile: str | None, verl: str | None) -> tuple[str, Release | None]:
    """The profile to model and the release named: ``--verl`` picks the profile; ``--profile`` alone keeps the
    profile's own version; both must agree (VersionError otherwise). Neither: the engine profile (verl 0.9.1)."""
    rel = release(verl) if verl else None
    if rel is not None and profile is not None and profile != rel.profile:
        raise VersionError(f"--verl {verl} runs the {rel.profile} profile; --profile {profile} contradicts it")
    return profile or (rel.profile if rel is not None else "engine"), rel


def apply_release(cfg: Any, rel: Release | None) -> Any:
    """``cfg`` for release ``rel``: its trainer loop set (0.8.0: v0; 0.9.x: v1 unless the config turns it off in
    0.9.x) and the release recorded (``cfg.release``); VersionError when the config asks for a loop the release
    lacks."""
    if rel is None:
        return cfg
    if rel.use_v1 is False and cfg.is_set("trainer.use_v1") and cfg.get("trainer.use_v1"):
        raise VersionError(f"trainer.use_v1=true: verl {rel.version} has no v1 loop (it came in 0.9.0)")
    if rel.use_v1 is False:
        cfg.set("trainer.use_v1", False, origin=f"--verl {rel.version}")
    cfg.release = rel
    return cfg
