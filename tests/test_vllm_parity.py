"""The vLLM rollout engine live, as verl's hybrid engine runs it, against HF and against the actor: two GRPO trainers
of 2 ranks (rollout TP=1: two engines; TP=2: one engine holding half the weights per rank), fp32, one update each.

Checks: greedy tokens == HF generate on the whole model (before and after an update + weight sync), TP=2 == TP=1
(greedy and seeded samples), the engine's log-probs of the sampled tokens as close to the actor's old_log_prob as fp32
rounding allows (verl's training/rollout_probs_diff_* logged; ``GAP_EPS_UNITS``), the live step's trace == the plan, each rank's share of the weights, the
KV cache the engine got == the plan's, and nothing left after each group closes (vLLM's caches only in labkit's folder,
``LABKIT_CACHE_DIR`` or ~/.cache/labkit: a warm one saves ~20 s of model inspection per start). One module run starts
two vLLM groups (the expensive part); every test reads what they recorded."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
import torch
from _procs import descendants, new_leftovers, run_leftovers

from labkit.rl import engines, rollout, rollout_metrics
from labkit.rl.vllm_engine import cache_root
from labkit.runtime.demo_worker import DemoWorker
from labkit.runtime.worker_group import WorkerGroup, live_groups
from labkit.trainer import engine_setup
from labkit.trainer.grpo_trainer import GRPOTrainer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not engines.vllm_available(), reason="vLLM is not installed here"),
]
ARR, R = "actor_rollout_ref", "actor_rollout_ref.rollout"
W, RESPONSE, LR = 2, 32, 1e-3
# The engine-vs-actor gap in fp32 is rounding: other kernels (vLLM's decode with a KV cache vs the actor's packed
# forward) sum in another order. It is deterministic for a machine's kernels (ISA, thread count), not a matter of
# load: 1.29e-5 at TP=1 both quiet and with a second suite running, on log-probs up to 4.9 in magnitude, i.e. 22
# units of fp32's resolution there (eps * max |log-prob|); an AVX2 machine measured 9.5e-6. The bound is 64 such
# units. A wrong log-prob (no temperature, a shifted token) is off by 1e-2 or more.
GAP_EPS_UNITS = 64.0
OTHER_CACHES = (
    Path(tempfile.gettempdir()) / f"torchinductor_{os.environ.get('USER', 'root')}",
    Path.home() / ".cache" / "vllm",
)


def _names(path: Path) -> set[str]:
    return set(os.listdir(path)) if path.is_dir() else set()


def others_ignored() -> dict[str, set]:
    """Entries of other programs on this shared machine that a leftovers check must not count: multiprocessing's
    named semaphores and /tmp/pymp-* folders whose listener a live process still serves (another user's fork server)."""
    with open("/proc/net/unix") as f:
        served = f.read()
    tmp = tempfile.gettempdir()
    pymp = {e for e in os.listdir(tmp) if e.startswith("pymp-") and f"{tmp}/{e}/" in served}
    return {"dev_shm": {n for n in os.listdir("/dev/shm") if n.startswith("sem.mp-")}, "tmp": pymp}


def _run(tp: int, batch) -> dict:
    """One trainer: engine greedy + seeded samples, a GRPO step, greedy after the sync; what it saw and left."""
    cfg = [
        f"trainer.n_gpus_per_node={W}",
        f"{R}.tensor_model_parallel_size={tp}",
        f"{ARR}.actor.entropy_coeff=0.01",  # a gradient even when every sample of a prompt scores the same
    ]
    before, others = run_leftovers(), {p: _names(p) for p in OTHER_CACHES}
    t0 = time.perf_counter()
    tr = GRPOTrainer(cfg, launcher="local", seed=0, lr=LR, progress=False, fixed_prompts=True)
    seen: dict = {"cold_start_s": time.perf_counter() - t0, "plan": engine_setup.engine_plan(tr.cfg)}
    try:
        seen["info"] = [i["rollout"] for i in tr.info]
        seen["rank_children"] = {pid: sorted(descendants(pid) - {pid}) for pid in tr.wg.pids}  # no EngineCore
        gen = dict(response_length=RESPONSE)
        seen["greedy"] = rollout.generate(tr.wg, batch, 1, do_sample=False, **gen).batch["responses"]
        seen["sampled"] = rollout.generate(tr.wg, batch, 2, seed=3, temperature=1.0, **gen).batch["responses"]
        t0 = time.perf_counter()
        seen["metrics"] = tr.step()
        seen["step_s"] = time.perf_counter() - t0
        seen["mismatches"], seen["gap"] = tr.mismatches(), rollout_metrics.token_gap(tr.batch)
        weights = tr.wg.full_params()[0]
        seen["greedy_after"] = rollout.generate(tr.wg, batch, 1, do_sample=False, **gen).batch["responses"]
        seen["hf_after"] = rollout.reference_generate(batch, 1, weights=weights, do_sample=False, **gen)
    finally:
        seen["report"] = tr.close()
    seen["left"] = new_leftovers(before, ignore=others_ignored())
    seen["other_caches"] = {str(p): _names(p) - names for p, names in others.items()}
    return seen


@pytest.fixture(scope="module")
def runs():
    WorkerGroup(DemoWorker, 1, launcher="local", timeout_s=60).close()  # the fork server, before any baseline
    batch = rollout.make_gen_batch(8, 11, 24, rollout.load_tokenizer())
    hf = rollout.reference_generate(batch, 1, do_sample=False, response_length=RESPONSE).batch["responses"]
    out = {"batch": batch, "hf": hf, 1: _run(1, batch), 2: _run(2, batch)}
    for tp in (1, 2):
        print(f"TP={tp}: cold start {out[tp]['cold_start_s']:.1f} s, one GRPO step {out[tp]['step_s']:.1f} s")
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_greedy_equals_hf_generate(runs, tp):
    assert torch.equal(runs[tp]["greedy"], runs["hf"]), f"TP={tp}: vLLM greedy tokens differ from HF generate's"


def test_tp2_equals_tp1_greedy_and_seeded_samples(runs):
    assert torch.equal(runs[2]["greedy"], runs[1]["greedy"])
    a, b = runs[1]["sampled"], runs[2]["sampled"]
    assert torch.equal(a, b), "each row's seed decides its sample, whatever the layout"
    assert not torch.equal(a[0::2], a[1::2]), "the n samples of a prompt differ (their rows have their own seeds)"


def gap_bound(run: dict) -> float:
    """The largest engine-vs-actor log-prob gap fp32 rounding explains (``GAP_EPS_UNITS``)."""
    return GAP_EPS_UNITS * torch.finfo(torch.float32).eps * max(1.0, float(run["gap"]["actor"].abs().max()))


@pytest.mark.parametrize("tp", [1, 2])
def test_rollout_log_probs_match_the_actors_old_log_prob(runs, tp):
    gap, m, bound = runs[tp]["gap"], runs[tp]["metrics"], gap_bound(runs[tp])
    worst = float(gap["diff"].abs().max())
    print(f"TP={tp}: max |gap| {worst:.2e}, bound {bound:.2e} ({worst / bound * GAP_EPS_UNITS:.0f} units)")
    assert gap["diff"].numel() > 50 and worst < bound, (worst, bound)
    assert m["training/rollout_probs_diff_valid"] == 1 and m["training/rollout_probs_diff_max"] < bound
    assert m["training/rollout_actor_probs_pearson_corr"] > 0.999999


@pytest.mark.parametrize("tp", [1, 2])
def test_after_an_update_and_a_sync_greedy_equals_hf_on_the_new_weights(runs, tp):
    run = runs[tp]
    assert run["metrics"]["actor/grad_norm"] > 0 and run["metrics"]["weight_sync/load_s"] > 0
    assert not torch.equal(run["greedy_after"], run["greedy"]), "the update changed the greedy tokens"
    assert torch.equal(run["greedy_after"], run["hf_after"].batch["responses"])


@pytest.mark.parametrize("tp", [1, 2])
def test_the_live_step_equals_the_plan(runs, tp):
    assert runs[tp]["mismatches"] == []


@pytest.mark.parametrize("tp", [1, 2])
def test_each_rank_holds_its_share_and_the_planned_kv_cache(runs, tp):
    info, plan = runs[tp]["info"], runs[tp]["plan"]
    cfg = engine_setup.model_values()
    norms = cfg["num_hidden_layers"] * 2 * cfg["hidden_size"] + cfg["hidden_size"]  # replicated in every rank
    full = info[0]["params_full"]
    assert sum(i["params_local"] for i in info) - full == (W // tp - 1) * full + (tp - 1) * norms
    assert all(i["kv_cache_tokens"] == plan.kv_cache_tokens for i in info)
    assert [i["seed"] for i in info] == [plan.seed + r // tp for r in range(W)]  # seed + replica rank
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND") is None:
        assert [i["cpu"] for i in info] == [[plan.cpu_binding[r]] for r in range(W)]


@pytest.mark.parametrize("tp", [1, 2])
def test_nothing_is_left_after_the_group_closes(runs, tp):
    run = runs[tp]
    assert all(children == [] for children in run["rank_children"].values()), run["rank_children"]  # in-process core
    assert run["report"]["left_pids"] == [] and live_groups() == []
    assert all(r.get("pg_destroyed") is True for r in run["report"]["teardown"]), run["report"]["teardown"]
    assert run["left"] == {}, run["left"]  # no process, /dev/shm segment, /tmp/torchelastic_* or pymp folder
    assert run["other_caches"] == {str(p): set() for p in OTHER_CACHES}
    assert (cache_root() / "vllm" / "modelinfos").is_dir(), "vLLM's cache goes to labkit's folder"
