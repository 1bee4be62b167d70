"""labkit.balance.micro_batches against verl: engine profile vs 0.9.1, legacy profile vs 0.7.1's seqlen_balancing.py.

Multi-rank cases run verl's rearrange_micro_batches on one thread per DP rank with a fake all_reduce
(tests/_oracle_legacy.py) and labkit's lockstep simulation `plan_dp_micro_batches`; both must agree exactly.
"""

from __future__ import annotations

import gc
import random
import threading
import time
from pathlib import Path

import pytest
import torch

from labkit.balance import micro_batches as MB
from labkit.balance.micro_batches import plan_dp_micro_batches, rearrange_micro_batches

V = pytest.importorskip("verl.utils.seqlen_balancing", reason="verl 0.9.1 (test oracle) is not installed")
from _oracle_legacy import load_function, load_legacy_module, make_batch, run_rearrange_case  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ORACLE_071 = ROOT / ".oracle" / "verl-0.7.1"
SEED_LENS = [800, 6500, 1200, 4000, 9000, 2500, 1500, 7500]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001
        return (type(err).__name__, str(err))


# --- worked examples ---


@pytest.mark.parametrize("profile", MB.PROFILES)
def test_seed_example(profile: str) -> None:
    plan = rearrange_micro_batches(SEED_LENS, 13312, profile=profile)
    assert plan.indices == [[0, 1, 3], [4, 6], [2, 5, 7]]
    assert plan.tokens == [11300, 10500, 11200]
    assert MB.get_reverse_idx([i for mb in plan.indices for i in mb]) == [0, 1, 5, 2, 3, 6, 4, 7]
    raw = rearrange_micro_batches(SEED_LENS, 13312, profile=profile, use_dynamic_bsz_balance=False)
    assert raw.indices == [[4, 6], [2, 5, 7], [0, 1, 3]]
    split = MB.static_micro_batches(8, 2, profile="legacy")
    assert [sum(SEED_LENS[i] for i in mb) for mb in split] == [7300, 5200, 11500, 9000]


def test_budget_is_a_cap_only_in_engine_profile() -> None:
    assert rearrange_micro_batches([6000, 6000, 6000, 1000], 10000, profile="legacy").tokens == [12000, 7000]
    assert rearrange_micro_batches([6000, 6000, 6000, 1000], 10000, profile="engine").tokens == [6000, 7000, 6000]
    assert rearrange_micro_batches([3000] * 4, 4000, profile="legacy").tokens == [3000, 6000, 3000]
    engine = rearrange_micro_batches([3000] * 4, 4000, profile="engine")
    assert engine.tokens == [3000] * 4 and engine.attempts == 2


def test_error_messages() -> None:
    with pytest.raises(
        AssertionError,
        match=r"^max_token_len must be greater than the sequence length\. "
        r"Got max_token_len=8192 and max_seq_len=9000$",
    ):
        rearrange_micro_batches(SEED_LENS, 8192)
    with pytest.raises(AssertionError, match=r"max_seq_len=9216$"):  # legacy padded path: the padded width counts
        rearrange_micro_batches([10, 20], 9000, profile="legacy", max_seq_len=9216)
    with pytest.raises(AssertionError, match=r"^Batch size 3 must be divisible by force_group_size 2$"):
        rearrange_micro_batches([1, 2, 3], 100, force_group_size=2)
    with pytest.raises(
        ValueError,
        match=r"^A forced group exceeds max_token_len and cannot be split\. "
        r"Got max_group_token_len=1200 and max_token_len=1000\.$",
    ):
        rearrange_micro_batches([600, 600, 10, 10], 1000, force_group_size=2)
    with pytest.raises(ValueError, match=r"Requested 5 non-empty micro-batches, but a rank has only 4 forced groups"):
        rearrange_micro_batches([10] * 4, 100, min_num_micro_batch=5)
    with pytest.raises(AssertionError, match=r"^$"):  # E32: legacy has a bare assert instead
        rearrange_micro_batches([10] * 4, 100, profile="legacy", min_num_micro_batch=5)
    with pytest.raises(
        AssertionError, match=r"^data size must be divisible by force_group_size \* micro_batch_size_per_gpu$"
    ):
        MB.static_micro_batches(10, 4)
    with pytest.raises(AssertionError, match=r"^3 vs\. 4$"):
        MB.restore_dynamic_batch(torch.zeros(4), [[0, 1], [2]])
    with pytest.raises(ValueError, match="profile must be one of"):
        rearrange_micro_batches([1], 10, profile="v0.5")


# --- random parity against verl ---


def random_case(rng: random.Random, profile: str) -> dict:
    """One micro-batching case: per-rank lengths, budget, layout, DP sync and verl's keyword arguments."""
    n_ranks = rng.choice([1, 1, 2, 3, 4, 8])
    g = rng.choice([1, 1, 1, 1, 2, 3])
    layout = "nested" if rng.random() < 0.2 else "padded"  # jagged tensors are slow to build; fewer of them
    kind = rng.randrange(4)
    low = 1 if layout == "nested" else 0
    ranks = []
    for _ in range(n_ranks):
        rows = rng.randint(1, 12) * g + (1 if rng.random() < 0.03 else 0)  # sometimes breaks E33
        if kind == 0:
            ranks.append([rng.randint(1, 1024) for _ in range(rows)])
        elif kind == 1:
            ranks.append([rng.choice([64, 256, 512]) for _ in range(rows)])  # heavy duplicates
        elif kind == 2:
            ranks.append([rng.randint(low, 3) for _ in range(rows)])  # lengths 0/1
        else:
            ranks.append([rng.choice([rng.randint(1, 100), rng.randint(800, 1024)]) for _ in range(rows)])
    longest = max(max(r) for r in ranks)
    width = longest + rng.choice([0, 0, 3, 100]) if layout == "padded" else None
    floor = width if width is not None else longest
    budget = max(1, rng.choice([floor, floor, floor + 1, 2 * floor, 4 * floor, 10 * floor, floor - 1]))
    kw = {"use_dynamic_bsz_balance": rng.random() < 0.7, "force_group_size": g}
    if rng.random() < 0.15:
        kw["num_batches_divided_by"] = rng.choice([2, 3])
    if rng.random() < 0.15:
        kw["min_num_micro_batch"] = rng.randint(1, 6)
    if rng.random() < 0.1:
        kw["same_micro_num_in_dp"] = False
    return {
        "ranks": ranks,
        "budget": budget,
        "layout": layout,
        "width": width,
        "kw": kw,
        "sync": n_ranks > 1 and rng.random() < 0.85 or n_ranks == 1 and rng.random() < 0.3,
    }


def labkit_outcome(case: dict, profile: str):
    per_rank = case["ranks"]
    if case["layout"] == "nested":  # verl's nested path takes max over a tensor: E31 then shows tensor(N)
        per_rank = [torch.tensor(lens, dtype=torch.long) for lens in per_rank]
    try:
        plans = plan_dp_micro_batches(
            per_rank, case["budget"], profile=profile, max_seq_len=case["width"], dp_group=case["sync"], **case["kw"]
        )
    except Exception as err:  # noqa: BLE001
        return (type(err).__name__, str(err))
    return ("ok", [plan.indices for plan in plans])


def verl_outcome(results: list[dict]):
    """All ranks' indices, or the lowest rank's error (ranks that did not raise would hang in verl)."""
    errors = [tuple(r["err"]) for r in results if "err" in r]
    if errors:
        return errors[0]
    assert not any("broken" in r for r in results)
    return ("ok", [r["idx"] for r in results])


def check_invariants(case: dict, profile: str, plans: list[list[list[int]]]) -> None:
    for lens, indices in zip(case["ranks"], plans):
        assert sorted(i for mb in indices for i in mb) == list(range(len(lens)))
        if profile == "engine":
            assert all(sum(lens[i] for i in mb) <= case["budget"] for mb in indices)
    if case["sync"] and case["kw"].get("same_micro_num_in_dp", True):
        assert len({len(indices) for indices in plans}) == 1


def test_engine_profile_matches_verl_091() -> None:
    rng = random.Random(91)
    outcomes = set()
    for _ in range(1000):
        case = random_case(rng, "engine")
        want = verl_outcome(run_rearrange_case(V, case))
        got = labkit_outcome(case, "engine")
        assert got == want, case
        outcomes.add(got[0])
        if got[0] == "ok":
            check_invariants(case, "engine", got[1])
    assert {"ok", "AssertionError", "ValueError"} <= outcomes  # the random cases reach the error paths too


@pytest.mark.skipif(not (ORACLE_071 / "verl").is_dir(), reason=f"verl 0.7.1 oracle not unpacked at {ORACLE_071}")
def test_legacy_profile_matches_verl_071() -> None:
    legacy = load_legacy_module(ORACLE_071)
    assert "within_limit" not in Path(legacy.__file__).read_text()  # really the version without the cap loop
    rng = random.Random(71)
    cases = [random_case(rng, "legacy") for _ in range(1000)]
    results = [run_rearrange_case(legacy, case) for case in cases]
    over_budget = 0
    for case, per_rank in zip(cases, results):
        want, got = verl_outcome(per_rank), labkit_outcome(case, "legacy")
        assert got == want, case
        if got[0] == "ok":
            check_invariants(case, "legacy", got[1])
            over_budget += any(
                sum(lens[i] for i in mb) > case["budget"] for lens, idx in zip(case["ranks"], got[1]) for mb in idx
            )
    assert over_budget > 0  # the legacy budget is not a cap, and the random cases show it


def test_empty_and_zero_length_batches_match_verl() -> None:
    for lens, width in (([], 8), ([0, 0, 0], 5), ([0, 4], 4)):
        case = {"ranks": [lens], "budget": 10, "layout": "padded", "width": width, "kw": {}, "sync": False}
        assert labkit_outcome(case, "engine") == verl_outcome(run_rearrange_case(V, case))


# --- the dp_sync hook ---


def ranks_on_threads(n_ranks: int, rank_main, timeout_s: float = 20.0) -> list:
    """rank_main(r, dp_sync) on one thread per rank, their DP all-reduces done through a barrier; the results."""
    barrier, slots, results = threading.Barrier(n_ranks, timeout=timeout_s), [None] * n_ranks, [None] * n_ranks

    def run(r: int) -> None:
        def dp_sync(op: str, values: list[int]) -> list[int]:
            slots[r] = values
            barrier.wait()
            reduced = [(max if op == "max" else min)(col) for col in zip(*slots)]
            barrier.wait()
            return reduced

        results[r] = rank_main(r, dp_sync)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n_ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_dp_sync_callable_on_threads_equals_lockstep_plan() -> None:
    rng = random.Random(5)
    per_rank = [[rng.randint(1, 4000) for _ in range(rng.randint(8, 40))] for _ in range(4)]
    for profile in MB.PROFILES:
        plans = ranks_on_threads(
            4, lambda r, sync: rearrange_micro_batches(per_rank[r], 6000, profile=profile, dp_sync=sync)
        )
        assert plans == plan_dp_micro_batches(per_rank, 6000, profile=profile)
        assert plans[0].syncs == (["max"] if profile == "legacy" else ["max", "max"] + ["min"] * plans[0].attempts)


def test_planner_is_fast_for_64_ranks() -> None:
    rng = random.Random(64)
    per_rank = [[rng.randint(64, 4096) for _ in range(256)] for _ in range(64)]
    best = float("inf")
    gc.collect()
    gc.disable()  # as timeit does: a collection of other tests' garbage is not the planner's time
    try:
        for _ in range(5):
            start = time.process_time()  # CPU time: the machine's cores are shared with other jobs
            plans = plan_dp_micro_batches(per_rank, 16384, profile="engine")
            best = min(best, time.process_time() - start)
    finally:
        gc.enable()
    assert len({p.num_micro_batches for p in plans}) == 1
    assert best < 0.100, f"{best * 1e3:.1f} ms"


@pytest.mark.parametrize("profile", MB.PROFILES)
def test_lockstep_kk_of_many_ranks_equals_one_rank_at_a_time(profile: str) -> None:
    """With >= 16 ranks of <= 160 rows, plan_dp_micro_batches partitions all ranks in one numpy lockstep KK; the
    plans must equal those of each rank planned alone (threads, the per-rank exact KK), errors included."""
    rng = random.Random(f"lockstep-{profile}")
    checked = set()
    for trial in range(12):
        n_ranks, rows = rng.choice([16, 24, 32]), rng.choice([8, 40, 64, 130])
        per_rank = [
            [rng.choice([rng.randint(1, 3000), rng.randint(1, 4)]) for _ in range(rows)] for _ in range(n_ranks)
        ]
        budget = rng.choice([3000, 6000, 20000])
        dp_group = trial % 3 != 0
        alone = ranks_on_threads(
            n_ranks,
            lambda r, sync: outcome(
                rearrange_micro_batches, per_rank[r], budget, profile=profile, dp_sync=sync if dp_group else None
            ),
        )
        together = outcome(plan_dp_micro_batches, per_rank, budget, profile=profile, dp_group=dp_group)
        errors = [o for o in alone if isinstance(o, tuple) and o[0] != "BrokenBarrierError"]
        assert together == (errors[0] if errors else alone), (profile, trial)
        checked.add("error" if errors else "ok")
    assert "ok" in checked


def test_each_batch_planned_together_equals_one_after_another() -> None:
    """plan_dp_micro_batches_each (an update's mini-batches in one lockstep, KK of all ranks together) gives what
    planning the mini-batches one after another gives, and the first error is the first failing mini-batch's."""
    rng = random.Random("each")
    seen = set()
    for trial in range(40):
        profile = MB.PROFILES[trial % 2]
        n_ranks, rows = rng.choice([1, 4, 16, 20]), rng.choice([2, 8, 33, 64])
        groups = [
            [[rng.choice([rng.randint(1, 3000), rng.randint(1, 4)]) for _ in range(rows)] for _ in range(n_ranks)]
            for _ in range(rng.randint(1, 4))
        ]
        budget = rng.choice([2000, 3000, 6000, 20000])
        kw = {"profile": profile, "dp_group": rng.random() < 0.8}
        together = outcome(MB.plan_dp_micro_batches_each, groups, budget, **kw)
        one_by_one = []
        for per_rank in groups:
            one = outcome(plan_dp_micro_batches, per_rank, budget, **kw)
            one_by_one.append(one)
            if isinstance(one, tuple):
                break
        want = one_by_one[-1] if isinstance(one_by_one[-1], tuple) else one_by_one
        assert together == want, (profile, trial)
        if isinstance(want, tuple):  # the exception says which mini-batch failed (0 when there is one)
            with pytest.raises((AssertionError, ValueError)) as info:
                MB.plan_dp_micro_batches_each(groups, budget, **kw)
            assert getattr(info.value, "batch_index", 0) == len(one_by_one) - 1, (profile, trial)
        seen.add("error" if isinstance(want, tuple) else "ok")
    assert seen == {"ok", "error"}
    for profile in MB.PROFILES:  # only the third mini-batch holds a row longer than the budget
        groups = [[[100, 200], [300, 50]], [[10, 20], [30, 40]], [[100, 2500], [30, 40]], [[9000], [9000]]]
        with pytest.raises((AssertionError, ValueError)) as info:
            MB.plan_dp_micro_batches_each(groups, 2000, profile=profile)
        assert info.value.batch_index == 2, profile
        assert outcome(MB.plan_dp_micro_batches_each, groups, 2000, profile=profile) == outcome(
            plan_dp_micro_batches, groups[2], 2000, profile=profile
        )


# --- TensorDicts, restore and static micro-batching against verl ---


@pytest.mark.parametrize("layout", ["padded", "nested"])
def test_tensordict_micro_batches_match_verl(layout: str) -> None:
    rng = random.Random(layout)
    for _ in range(20):
        lens = [rng.randint(1, 300) for _ in range(rng.randint(1, 12))]
        batch = make_batch(lens, layout, 310 if layout == "padded" else None)
        batch["row"] = torch.arange(len(lens))
        budget = rng.choice([310, 600, 1000])
        want_mbs, want_idx = V.rearrange_micro_batches(batch, budget)
        got_mbs, plan = MB.rearrange_tensordict(batch, budget)
        assert plan.indices == want_idx
        for got, want in zip(got_mbs, want_mbs):
            assert torch.equal(got["row"], want["row"])
            if layout == "nested":
                rows = [[t.tolist() for t in mb["input_ids"].unbind()] for mb in (got, want)]
                assert rows[0] == rows[1]
            else:
                assert torch.equal(got["attention_mask"], want["attention_mask"])
        outputs = torch.cat([mb["row"] for mb in got_mbs]).float()
        assert torch.equal(MB.restore_dynamic_batch(outputs, plan.indices), V.restore_dynamic_batch(outputs, want_idx))
    nested = make_batch([9000, 10], "nested", None)
    assert outcome(MB.rearrange_tensordict, nested, 8192) == outcome(V.rearrange_micro_batches, nested, 8192)


def test_restore_nested_and_lists() -> None:
    idx = [[2, 0], [1]]
    rows = [torch.arange(n) for n in (3, 1, 2)]  # outputs in micro-batch order for rows 2, 0, 1
    nested = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    got = [t.tolist() for t in MB.restore_dynamic_batch(nested, idx).unbind()]
    assert got == [t.tolist() for t in V.restore_dynamic_batch(nested, idx).unbind()] == [[0], [0, 1], [0, 1, 2]]
    assert MB.restore_dynamic_batch(["c", "a", "b"], idx) == ["a", "b", "c"]


def test_static_micro_batches_match_verl() -> None:
    from verl.protocol import DataProto
    from verl.utils import tensordict_utils as tu

    path = Path(V.__file__).parents[1] / "workers" / "engine" / "utils.py"
    namespace = {
        "tu": tu,
        "rearrange_micro_batches": V.rearrange_micro_batches,
        "TensorDict": type(make_batch([1], "padded", 1)),
    }
    prepare = load_function(path, "prepare_micro_batches", namespace)
    for rows in range(0, 13):
        for m in range(1, 6):
            proto = DataProto.from_dict({"row": torch.arange(rows)}) if rows else None
            if proto is not None:
                want = [mb.batch["row"].tolist() for mb in proto.split(m)]
                assert MB.static_micro_batches(rows, m, profile="legacy") == want
            for g in (1, 2):
                td = make_batch([1] * rows, "padded", 1)
                td["row"] = torch.arange(rows)
                tu.assign_non_tensor(td, use_dynamic_bsz=False, micro_batch_size_per_gpu=m, force_group_size=g)
                want = outcome(lambda: [mb["row"].tolist() for mb in prepare(td)[0]])
                assert outcome(MB.static_micro_batches, rows, m, profile="engine", force_group_size=g) == want
