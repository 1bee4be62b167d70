"""What a phase is: the micro-batch one GPU feeds in a pass (``PassShape``) and the phase's instants, each a sum of
named terms, with its peak (``Phase``). Shared by the FSDP and Megatron phases, the fix search and the answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PassShape:
    """The largest micro-batch one GPU feeds in a pass: its rows and its tokens (per Ulysses rank, as fed)."""

    rows: int
    tokens: int
    real_tokens: int | None = None
    """The padded path's real tokens among ``tokens`` (None: every token fed is real)."""


@dataclass
class Phase:
    """One phase on one GPU: the instants' terms, the peak instant and its bytes; ``info`` holds derived facts."""

    name: str
    instants: dict[str, dict[str, int]]
    info: dict[str, object] = field(default_factory=dict)

    @property
    def peak_instant(self) -> str:
        return max(self.instants, key=lambda k: sum(self.instants[k].values()))

    @property
    def terms(self) -> dict[str, int]:
        """The terms live at the peak, largest first (zero terms left out)."""
        live = self.instants[self.peak_instant]
        return dict(sorted(((k, v) for k, v in live.items() if v), key=lambda kv: -kv[1]))

    @property
    def peak_bytes(self) -> int:
        return sum(self.instants[self.peak_instant].values())
