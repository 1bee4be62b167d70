"""A local launcher whose start fails reports the failure itself, whatever was started before it."""

from __future__ import annotations

import pytest

from labkit.runtime import local_launcher
from labkit.runtime.local_launcher import LocalLauncher


def test_a_failed_start_raises_its_cause_not_an_index_error(monkeypatch):
    def fail_before_any_rank(self, ctx, host_kwargs):
        raise RuntimeError("the fork server could not start rank 0")

    monkeypatch.setattr(local_launcher.LocalLauncher, "_spawn", fail_before_any_rank)
    with pytest.raises(RuntimeError, match="could not start rank 0"):
        LocalLauncher(2, [{}, {}], start_method="spawn")
