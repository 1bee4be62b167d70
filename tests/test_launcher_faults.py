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


@pytest.mark.parametrize("key", ["timeout_s", "collective_timeout_s"])
def test_a_huge_timeout_is_refused_before_any_process_starts(key):
    from labkit.runtime.demo_worker import DemoWorker
    from labkit.runtime.worker_group import WorkerGroup

    with pytest.raises(ValueError, match=f"{key} must be at most 2,592,000 seconds"):
        WorkerGroup(DemoWorker, 2, launcher="local", **{key: 1e14})
