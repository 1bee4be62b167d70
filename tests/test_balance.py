"""labkit.balance.balance_batch against verl 0.9.1 (verl/utils/seqlen_balancing.py and RayPPOTrainer._balance_batch).

Every random case is run through both; partitions (tie-breaks included), metrics and errors must be identical.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from labkit.balance import balance_batch as L
from labkit.balance import kk

V = pytest.importorskip("verl.utils.seqlen_balancing", reason="verl 0.9.1 (test oracle) is not installed")

FUNCS = ("karmarkar_karp", "get_seqlen_balanced_partitions", "greedy_partition")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The oracle's small tensor ops run faster on one thread on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def outcome(fn, *args, **kwargs):
    """What a call returns, or (exception type, message) if it raises."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001
        return (type(err).__name__, str(err))


def random_values(rng: random.Random, n: int) -> list:
    """Lengths/workloads of many shapes: heavy ties, zeros and ones, real workloads, wide ints, negatives, floats."""
    kind = rng.randrange(8)
    if kind == 0:
        return [rng.randint(0, 2) for _ in range(n)]  # heavy ties
    if kind == 1:
        return [rng.choice([0, 1]) for _ in range(n)]
    if kind == 2:
        return L.calculate_workload([rng.randint(1, 8192) for _ in range(n)])
    if kind == 3:
        return [rng.choice([100, 200, 300]) * rng.choice([1, 1, 2]) for _ in range(n)]  # duplicates + sum ties
    if kind == 4:
        return [rng.randint(0, 10**12) for _ in range(n)]
    if kind == 5:
        return [rng.randint(-4, 4) for _ in range(n)]  # negatives: empty largest sets, heap-position ties
    if kind == 6:
        return [rng.choice([0.1, 0.2, 0.3, 0.7]) for _ in range(n)]  # float sums depend on addition order
    return [rng.random() * 1000 for _ in range(n)]


def random_case(rng: random.Random, equal_size: bool, sizes=(1, 2, 3, 5, 8, 12, 16, 24, 40, 64)) -> tuple[list, int]:
    n = rng.choice(sizes)
    k = rng.choice([1, n, rng.randint(1, n), rng.randint(1, max(1, n // 2))])
    if equal_size and rng.random() < 0.9:
        n = max(k, n - n % k)
    return random_values(rng, n), k


@pytest.mark.parametrize("equal_size", [True, False], ids=["equal", "free"])
@pytest.mark.parametrize("fn", FUNCS)
def test_partitions_match_verl_on_random_inputs(fn: str, equal_size: bool) -> None:
    rng = random.Random(f"{fn}-{equal_size}")
    for _ in range(1200):
        values, k = random_case(rng, equal_size)
        expected = outcome(getattr(V, fn), values, k, equal_size)
        assert outcome(getattr(L, fn), values, k, equal_size) == expected, (values, k)


@pytest.mark.parametrize("equal_size", [True, False], ids=["equal", "free"])
def test_array_and_tensor_inputs_match_verl(equal_size: bool) -> None:
    rng = random.Random(7)
    for trial in range(60):
        values, k = random_case(rng, equal_size, sizes=(1, 2, 3, 5, 8, 12, 16))
        ints = [abs(int(v)) for v in values]
        for arr in (torch.tensor(ints), np.array(ints), torch.tensor(values, dtype=torch.float32), np.array(values)):
            for fn in ("karmarkar_karp", "get_seqlen_balanced_partitions"):
                expected = outcome(getattr(V, fn), arr, k, equal_size)
                assert outcome(getattr(L, fn), arr, k, equal_size) == expected, (trial, arr, k)


@pytest.mark.parametrize(
    ("n", "k", "equal_size"), [(720, 6, True), (1536, 64, True), (1024, 16, False), (640, 40, False)]
)
def test_large_inputs_match_verl(n: int, k: int, equal_size: bool) -> None:
    rng = random.Random(n)
    workloads = L.calculate_workload([rng.randint(16, 8192) for _ in range(n)])
    assert L.karmarkar_karp(workloads, k, equal_size) == V.karmarkar_karp(workloads, k, equal_size)


def test_numpy_equal_size_path_agrees_with_the_python_path() -> None:
    """Equal-size KK with k >= 48 runs on numpy rows; it must pop and merge exactly like the int-key path."""
    rng = random.Random(48)
    for _ in range(200):
        k = rng.choice([48, 50, 64])
        values = random_values(rng, k * rng.randint(1, 10))
        values = [abs(int(v)) for v in values]
        assert kk.kk_equal_np(values, k) == kk._kk_int(values, k, equal_size=True) == L.karmarkar_karp(values, k, True)


def test_lockstep_batch_kk_matches_verl() -> None:
    """kk_free_batch runs R free-size instances in lockstep on numpy rows; each instance must come out as verl's
    get_seqlen_balanced_partitions gives it (empty sets as []), on ties, zeros, k = 1 and k = N included."""
    rng = random.Random("lockstep")
    checked = 0
    for _ in range(60):
        n = rng.choice([1, 2, 3, 5, 8, 16, 40, 64])
        k = rng.choice([1, n, rng.randint(1, n), min(n, 2)])
        kind = rng.randrange(3)
        rows = [
            [rng.randint(0, 2) for _ in range(n)]
            if kind == 0
            else L.calculate_workload([rng.randint(0, 4096) for _ in range(n)])
            if kind == 1
            else [rng.choice([100, 200, 300]) for _ in range(n)]
            for _ in range(rng.randint(1, 24))
        ]
        got = kk.kk_free_batch(np.array(rows, dtype=np.int64), k)
        for values, parts in zip(rows, got):
            want = [sorted(p) for p in V.karmarkar_karp(values, k, False)]
            assert parts == want, (values, k)
            checked += 1
    assert checked > 500


EDGE_CASES = [
    ([5], 1, False),
    ([5], 1, True),
    ([0, 0, 0, 0], 4, True),
    ([0, 0, 0], 2, False),
    ([1, 1, 1, 1], 2, True),
    ([7, 7, 7, 7, 7, 7], 3, False),
    ([3, 1, 2], 3, False),
    ([0, 1, 0, 1], 2, False),
    ([10, 0, 0, 0], 3, False),
    ([-5, 1, 1], 2, False),
    ([-5, -1, 3, 1], 3, False),  # E37 via negative values
    ([1, 2], 3, False),
    ([], 1, False),  # E36
    ([1, 2, 3], 2, True),  # E38
    ([1, 2], 0, False),
    ([1, 2], 0, True),
    ([1, 2], -1, True),
    ([1, 2, 3], -2, True),
    ([], 0, False),
    ([], 1, True),
]


@pytest.mark.parametrize(("values", "k", "equal_size"), EDGE_CASES)
def test_edge_cases_and_bad_inputs_match_verl(values: list, k: int, equal_size: bool) -> None:
    for fn in FUNCS:
        assert outcome(getattr(L, fn), values, k, equal_size) == outcome(getattr(V, fn), values, k, equal_size)


def test_error_messages_are_verls() -> None:
    assert outcome(L.get_seqlen_balanced_partitions, [1, 2], 3, False) == (
        "AssertionError",
        "number of items:[2] < k_partitions:[3]",
    )
    assert outcome(L.get_seqlen_balanced_partitions, [1, 2, 3], 2, True) == ("AssertionError", "3 % 2 != 0")
    assert outcome(L.get_seqlen_balanced_partitions, [-5, 1, 1], 2, False) == (
        "AssertionError",
        "the 0-th partition is empty",
    )


def test_seed_example_trace() -> None:
    """The 8-sample example: KK over the 8 workloads with k=3 gives {6,4} / {2,7,5} / {0,3,1}."""
    lens = [800, 6500, 1200, 4000, 9000, 2500, 1500, 7500]
    assert L.karmarkar_karp(L.calculate_workload(lens), 3, False) == [[6, 4], [2, 7, 5], [0, 3, 1]]


def test_calculate_workload_keeps_dtypes() -> None:
    assert L.calculate_workload([10, 20]) == [245860, 491920]
    for t in (torch.tensor([10, 20]), torch.tensor([10, 20], dtype=torch.int32), torch.tensor([1.5, 2.0])):
        got, want = L.calculate_workload(t), V.calculate_workload(t)
        assert got.dtype == want.dtype and torch.equal(got, want)
    arr = L.calculate_workload(np.array([3, 4], dtype=np.int32))
    assert arr.dtype == np.int32 and arr.tolist() == [73737, 98320]


def test_log_seqlen_unbalance_example() -> None:
    """log_seqlen_unbalance on lengths [10, 20, 30, 40] and partitions [[0, 3], [1, 2]], executed in verl."""
    want = {
        "global_seqlen/min": 30,
        "global_seqlen/max": 70,
        "global_seqlen/minmax_diff": 40,
        "global_seqlen/balanced_min": 50,
        "global_seqlen/balanced_max": 50,
        "global_seqlen/mean": 50.0,
    }
    got = L.log_seqlen_unbalance([10, 20, 30, 40], [[0, 3], [1, 2]], "global_seqlen")
    assert got == want == V.log_seqlen_unbalance([10, 20, 30, 40], [[0, 3], [1, 2]], "global_seqlen")
    assert L.balance_batch([10, 20, 30, 40], 2).metrics == want


# --- RayPPOTrainer._balance_batch, compiled from verl's source (ray_trainer.py needs torchdata to import) ---


def _compile_balance_batch(tensor_workloads: bool):
    """verl's _balance_batch as a function of (seqlens, dp_size, ...) -> (row order, metrics).

    verl computes workloads as a tensor, so KK compares 0-d tensors (about 10x slower than ints). With
    `tensor_workloads=False` they are handed over as a list of the same ints: identical partitions (checked by
    test_array_and_tensor_inputs_match_verl and test_balance_batch_tensor_path_matches_verl), more cases per second.
    """
    from _oracle_legacy import load_function
    from verl.protocol import DataProto  # only named in the method's annotations

    workload = V.calculate_workload if tensor_workloads else (lambda t: V.calculate_workload(t).tolist())
    path = Path(V.__file__).parents[1] / "trainer" / "ppo" / "ray_trainer.py"
    namespace = {
        "torch": torch,
        "np": np,
        "DataProto": DataProto,
        "calculate_workload": workload,
        "get_seqlen_balanced_partitions": V.get_seqlen_balanced_partitions,
        "log_seqlen_unbalance": V.log_seqlen_unbalance,
    }
    method = load_function(path, "_balance_batch", namespace, cls="RayPPOTrainer")

    def run(seqlens, dp_size, keep_minibatch=False, mini=None, prefix=False, uids=None):
        width = max(seqlens) + 3
        mask = torch.arange(width)[None, :] < torch.tensor(seqlens).reshape(-1, 1)  # bool: its row sums are int64
        batch = SimpleNamespace(
            batch={"attention_mask": mask},
            rows=torch.arange(len(seqlens)),
            non_tensor_batch={"uid": np.array(uids, dtype=object)} if uids is not None else {},
        )
        batch.reorder = lambda idx: setattr(batch, "rows", batch.rows[idx])  # what DataProto.reorder does to rows
        trainer = SimpleNamespace(
            _get_dp_size=lambda wg, role: dp_size,
            actor_rollout_wg=None,
            use_prefix_grouper=prefix,
            config=SimpleNamespace(actor_rollout_ref=SimpleNamespace(actor={"ppo_mini_batch_size": mini})),
        )
        metrics: dict = {}
        method(trainer, batch, metrics, keep_minibatch=keep_minibatch)
        return batch.rows.tolist(), metrics

    return run


@pytest.fixture(scope="module")
def verl_balance_batch():
    return _compile_balance_batch(tensor_workloads=False)


def _labkit_balance(seqlens, dp_size, keep_minibatch=False, mini=None, prefix=False, uids=None):
    res = L.balance_batch(
        seqlens, dp_size, keep_minibatch=keep_minibatch, ppo_mini_batch_size=mini, use_prefix_grouper=prefix, uids=uids
    )
    assert res.global_idx == [i for part in res.partitions for i in part]
    return res.global_idx, res.metrics


def test_balance_batch_matches_verl(verl_balance_batch) -> None:
    rng = random.Random(11)
    for _ in range(1000):
        dp = rng.choice([1, 2, 3, 4, 6, 8])
        n = dp * rng.randint(1, 8)
        seqlens = [rng.choice([rng.randint(1, 2048), rng.randint(1, 3), 512]) for _ in range(n)]
        assert outcome(_labkit_balance, seqlens, dp) == outcome(verl_balance_batch, seqlens, dp), (seqlens, dp)
        rows, _ = _labkit_balance(seqlens, dp)
        assert sorted(rows) == list(range(n))  # a permutation, one equal chunk per rank


def test_balance_batch_on_many_ranks_matches_verl(verl_balance_batch) -> None:
    """dp >= 48 takes the numpy path (equal-size KK on int64 rows, vectorized in-rank order); same as verl."""
    rng = random.Random(48)
    for _ in range(12):
        dp = rng.choice([48, 64, 96])
        seqlens = [rng.choice([rng.randint(1, 4096), rng.randint(1, 3), 512]) for _ in range(dp * rng.randint(1, 6))]
        assert outcome(_labkit_balance, seqlens, dp) == outcome(verl_balance_batch, seqlens, dp), dp


def test_balance_batch_tensor_path_matches_verl() -> None:
    verl_tensor_path = _compile_balance_batch(tensor_workloads=True)
    rng = random.Random(10)
    for _ in range(60):
        dp = rng.choice([1, 2, 4])
        seqlens = [rng.choice([rng.randint(1, 4096), 7]) for _ in range(dp * rng.randint(1, 6))]
        assert _labkit_balance(seqlens, dp) == verl_tensor_path(seqlens, dp)


def test_balance_batch_variants_match_verl(verl_balance_batch) -> None:
    rng = random.Random(12)
    for _ in range(200):
        dp = rng.choice([1, 2, 4])
        n_resp = rng.choice([1, 2, 4])
        groups = dp * rng.randint(1, 5) + (1 if rng.random() < 0.1 else 0)  # sometimes breaks E40
        uids = [f"u{g}" for g in range(groups) for _ in range(n_resp)]
        seqlens = [rng.randint(1, 3000) for _ in uids]
        mini = rng.choice([dp, 2 * dp, len(uids)])
        for kwargs in ({"keep_minibatch": True, "mini": mini}, {"prefix": True, "uids": uids}, {"prefix": True}):
            got = outcome(_labkit_balance, seqlens, dp, **kwargs)
            assert got == outcome(verl_balance_batch, seqlens, dp, **kwargs), (seqlens, dp, kwargs)


def test_balance_batch_errors() -> None:
    with pytest.raises(AssertionError, match=r"^10 % 4 != 0$"):  # E38: B·n not divisible by D
        L.balance_batch([5] * 10, 4)
    with pytest.raises(ValueError, match=r"^PrefixGrouper with balance_batch requires num_uid_groups \(3\) % dp_size"):
        L.balance_batch([5] * 6, 2, use_prefix_grouper=True, uids=["a", "a", "b", "b", "c", "c"])


def test_group_partitions_match_verl() -> None:
    rng = random.Random(13)
    for _ in range(300):
        uids = [rng.choice("abcdef") for _ in range(rng.randint(1, 30))]
        seqlens = [rng.randint(0, 4000) for _ in uids]
        k = rng.randint(1, 5)
        want = outcome(V.get_group_balanced_partitions, seqlens, uids, k)
        assert outcome(L.get_group_balanced_partitions, seqlens, uids, k) == want
