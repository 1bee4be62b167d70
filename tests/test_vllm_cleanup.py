"""A vLLM engine group leaves nothing behind, also when a rank raises: 2 ranks, rollout TP=2 (one engine), a normal
rollout, then rank 1 raises while rank 0 waits in the engine's TP all-reduces (no timeout there). The driver names
rank 1's error within seconds (not the call timeout), and once the group is closed there is no rank process, no
/dev/shm segment (vLLM's CPU segments, its message queue's psm_*), no group folder and no cache outside labkit's."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from _procs import new_leftovers, run_leftovers
from _vllm_ranks import RAISE_KEY, RaisingRollout
from test_vllm_parity import OTHER_CACHES, _names, others_ignored

from labkit.rl import engines, rollout
from labkit.rl.vllm_engine import cache_root
from labkit.runtime import rank_files
from labkit.runtime.demo_worker import DemoWorker
from labkit.runtime.worker_group import RankError, WorkerGroup, live_groups
from labkit.trainer import engine_setup
from labkit.trainer.live_config import rollout_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not engines.vllm_available(), reason="vLLM is not installed here"),
]


def test_a_rank_that_raises_mid_rollout_leaves_nothing():
    WorkerGroup(DemoWorker, 1, launcher="local", timeout_s=60).close()  # the fork server, before the baseline
    before, others = run_leftovers(), {p: _names(p) for p in OTHER_CACHES}
    cfg = rollout_config(["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    kwargs = engine_setup.rollout_kwargs(cfg)
    assert kwargs["name"] == "vllm"
    t0 = time.perf_counter()
    wg = WorkerGroup(RaisingRollout, 2, launcher="local", init_kwargs=kwargs, timeout_s=120,
                     env=engine_setup.rank_env("vllm"))  # fmt: skip
    try:
        wg.init_model()
        cold = time.perf_counter() - t0
        batch = rollout.make_gen_batch(4, 0, 24, rollout.load_tokenizer())
        assert len(rollout.generate(wg, batch, 2, response_length=8)) == 8  # the engine works, its segments exist
        segments = [n for n in os.listdir("/dev/shm") if "cpushm" in n and os.path.basename(wg.group_dir)[-8:] in n]
        assert len(segments) == 2, os.listdir("/dev/shm")  # one per TP rank, named after this group
        batch.meta_info[RAISE_KEY] = 1
        t1 = time.perf_counter()
        with pytest.raises(RankError) as err:
            rollout.generate(wg, batch, 2, response_length=8)
        took = time.perf_counter() - t1
    finally:
        report = wg.close()
    assert err.value.rank == 1 and "told to raise before its engine" in str(err.value), err.value
    assert "(also failed: ranks [0])" in str(err.value) and took < 10, (took, str(err.value)[:300])
    assert wg.alive_pids() == [] and live_groups() == [], report
    assert not os.path.exists(wg.group_dir) and not set(segments) & set(os.listdir("/dev/shm")), wg.swept
    assert new_leftovers(before, ignore=others_ignored()) == {}
    assert {str(p): _names(p) - names for p, names in others.items()} == {str(p): set() for p in OTHER_CACHES}
    assert (cache_root() / "vllm" / "modelinfos").is_dir()
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(rank_files.PREFIX + str(os.getpid()))]
    print(f"vLLM group of 2 (TP=2): cold start {cold:.1f} s; the raise was reported in {took:.1f} s")
    assert Path(wg.group_dir).name.startswith(rank_files.PREFIX)
