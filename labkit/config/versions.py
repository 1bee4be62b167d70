"""verl releases as users name them (``--verl 0.8.0``): which profile, trainer loop and dispatch each one runs, and
where its batch path differs from what labkit models.

The facts come from each release's own code: 0.5.x registers the FSDP workers' data methods with
``Dispatch.DP_COMPUTE_PROTO`` (the all-gather dispatch); 0.6.x and 0.7.x run the legacy ``fsdp_workers.py`` by default
(``trainer.use_legacy_worker_impl=auto``); 0.8.0 ships ``engine_workers.py`` only (no legacy workers, no v1 loop);
0.9.0 adds the v1 loop (``trainer.use_v1: true``). Up to 0.9.0 ``verl/utils/seqlen_balancing.py:
rearrange_micro_batches`` sets the micro-batch count from the token budget and never re-checks it (a micro-batch may
exceed the budget); 0.9.1 grows the count until every micro-batch fits. 0.9.0's synthetic v1 padding rows are 2 tokens
(``verl/trainer/ppo/padding_utils.py``), 0.9.1's 128.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from labkit.config.messages import InputError


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

    @property
    def label(self) -> str:
        loop = "legacy workers" if self.profile == "legacy" else f"engine workers, {'v1' if self.use_v1 else 'v0'} loop"
        return f"verl {self.version} ({loop})"


_LEGACY_ORACLE = "labkit's legacy profile is checked against verl 0.7.1's code"
RELEASES: dict[str, Release] = {
    "0.5": Release(
        "0.5",
        "legacy",
        None,
        dispatch="all_gather",
        differences=(
            "0.5 dispatches with DP_COMPUTE_PROTO (the all-gather dispatch, selected for you)",
            _LEGACY_ORACLE,
        ),
    ),
    "0.6": Release("0.6", "legacy", None, differences=(_LEGACY_ORACLE,)),
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
_ALIASES = {"0.5.0": "0.5", "0.6.0": "0.6", "0.6.1": "0.6", "0.7.0": "0.7", "0.7.1": "0.7", "0.8.0": "0.8"}


class VersionError(InputError):
    """A verl version labkit does not model."""


def release(text: str) -> Release:
    """The release ``text`` names (``0.8``, ``0.8.0``, ``v0.9.1``); VersionError for one labkit does not model."""
    key = re.sub(r"^v", "", str(text).strip())
    key = _ALIASES.get(key, key)
    if key not in RELEASES:
        known = ", ".join(sorted({*RELEASES, *_ALIASES}, key=lambda v: [int(x) for x in v.split(".")]))
        raise VersionError(f"--verl {text}: labkit models verl {known} (older releases are not modelled)")
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
