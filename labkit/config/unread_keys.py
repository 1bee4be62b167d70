"""Keys verl's code never reads on a given path (``data/unread_keys.yaml``): per release, trainer loop and engine,
audited on the installed 0.7.1, 0.8.0, 0.9.0 and 0.9.1 (``scripts/verl_key_reads.py``). A key a config sets that the run's
verl never reads does nothing there; an answer names it with the code that reads it elsewhere.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

AUDIT = Path(__file__).resolve().parents[2] / "data" / "unread_keys.yaml"
AUDITED = {"0.7": "0.7.1", "0.8": "0.8.0", "0.9.0": "0.9.0", "0.9.1": "0.9.1"}
"""The releases as labkit names them (``--verl``) whose code was audited, and the version audited."""
DEFAULT_AUDITED = {"legacy": "0.7.1", "engine": "0.9.1"}
"""The release each profile models when none is named."""


@dataclass(frozen=True)
class Unread:
    """One audit entry: keys no code on the paths ``at`` reads (``unread``), or hands whole to another library that
    does (``passed``)."""

    keys: tuple[str, ...]
    at: tuple[str, ...]
    kind: str
    where: str
    why: str = ""
    to: str = ""
    scan: bool = True
    """Whether the scan of verl's code confirms it (False: found by reading the code, a name another key shares)."""

    def covers(self, key: str, path: str) -> bool:
        return any(fnmatch.fnmatchcase(key, k) for k in self.keys) and any(
            fnmatch.fnmatchcase(path, a) for a in self.at
        )


@cache
def entries() -> tuple[Unread, ...]:
    out = []
    for entry in yaml.safe_load(AUDIT.read_text()):
        out.append(Unread(tuple(entry["keys"]), tuple(entry["at"]), entry["kind"], entry["where"],
                          entry.get("why", ""), entry.get("to", ""), entry.get("scan", True)))  # fmt: skip
    return tuple(out)


@cache
def audit_entry(key: str, path: str) -> Unread | None:
    """The first entry covering ``key`` on ``path`` (``"0.9.1 v1 fsdp"``), or None: verl's code there reads it."""
    return next((e for e in entries() if e.covers(key, path)), None)


def audit_path(profile: str, release_version: str | None, loop: str, megatron: bool) -> str | None:
    """``"<release> <loop> <engine>"`` of a run, or None when its release's code was not audited."""
    release = DEFAULT_AUDITED[profile] if release_version is None else AUDITED.get(release_version)
    if release is None:
        return None
    return f"{release} {loop} {'megatron' if megatron else 'fsdp'}"


def describe(path: str) -> str:
    """``"verl 0.9.1 (v1 loop, FSDP)"`` for ``"0.9.1 v1 fsdp"``."""
    release, loop, engine = path.split()
    run = "legacy workers" if loop == "legacy" else f"{loop} loop"
    return f"verl {release} ({run}, {'Megatron' if engine == 'megatron' else 'FSDP'})"


def never_read(key: str, path: str | None) -> str | None:
    """What an answer says of a key the run's verl never reads: ``verl 0.9.1 (v1 loop, FSDP) never reads it: why
    (where)``; None when that verl reads it, passes it on, or was not audited."""
    entry = audit_entry(key, path) if path is not None else None
    if entry is None or entry.kind != "unread":
        return None
    return f"{describe(path)} never reads it: {entry.why} ({entry.where})"


SP_MIXER_PATCHES = {
    "0.7.1": frozenset(),
    "0.8.0": frozenset(),
    "0.9.0": frozenset({"qwen3_5", "qwen3_5_moe"}),
    "0.9.1": frozenset({"qwen3_5", "qwen3_5_moe"}),
}
"""Per audited release, the model types whose non-attention sequence mixers (gated delta-net, Mamba) its Ulysses
patch reaches: ``verl/models/transformers/monkey_patch.py: apply_monkey_patch`` replaces their
``GatedDeltaNet.forward`` (0.9.x, Qwen3.5 only). For every other model only the flash-attention layers are patched:
verl slices the sequence across the SP group before the model, so the other mixers see one rank's shard alone."""


def sp_unsplit_mixers(path: str | None, model_type: str | None, mixers: tuple[str, ...]) -> tuple[str, ...]:
    """The sequence mixers of a ``model_type`` model that verl's Ulysses patch on ``path`` leaves on each rank's
    shard (empty: every mixer is split, the model has none, or the release or model is unknown)."""
    if path is None or model_type is None or path.split()[2] != "fsdp":
        return ()
    if model_type in SP_MIXER_PATCHES[path.split()[0]]:
        return ()
    return tuple(mixers)
