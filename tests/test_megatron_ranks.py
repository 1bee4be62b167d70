"""labkit.rules.megatron_ranks against megatron-core 0.16.1's own code (tests/_oracle_mcore.py): every dense and
expert group of random layouts (W up to 1,024, every dimension, some non-default orders) equals
``RankGenerator.get_ranks``; ``initialize_model_parallel``, run with no process group made, builds the same groups
and fails the same checks with the same text; each rank's coordinates, verl's DP rank and output ranks
(``is_mp_src_rank_with_outputs``) follow from megatron-core's groups (a rank's place in its TP/CP/DP/PP group)."""

from __future__ import annotations

import math
import random
import re
import time

import numpy as np
import pytest
from _oracle_mcore import init_model_parallel, mcore

from labkit.rules.megatron_ranks import (
    DEFAULT_ORDER,
    DENSE_GROUPS,
    EXPERT_GROUPS,
    generator_check,
    layout_check,
    megatron_ranks,
)
from labkit.rules.parallel_layout import MEGATRON, ParallelLayout

pytestmark = pytest.mark.filterwarnings("ignore")

# group_desc of initialize_model_parallel -> (expert generator?, kind)
MCORE_GROUPS = {
    "TENSOR_MODEL_PARALLEL_GROUP": (False, "tp"),
    "CONTEXT_PARALLEL_GROUP": (False, "cp"),
    "DATA_PARALLEL_GROUP": (False, "dp"),
    "PIPELINE_MODEL_PARALLEL_GROUP": (False, "pp"),
    "DATA_PARALLEL_GROUP_WITH_CP": (False, "dp-cp"),
    "MODEL_PARALLEL_GROUP": (False, "tp-pp"),
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": (False, "tp-cp"),
    "TENSOR_AND_DATA_PARALLEL_GROUP": (False, "tp-dp"),
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": (False, "tp-dp-cp"),
    "EXPERT_MODEL_PARALLEL_GROUP": (True, "ep"),
    "EXPERT_TENSOR_PARALLEL_GROUP": (True, "tp"),
    "EXPERT_DATA_PARALLEL_GROUP": (True, "dp"),
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": (True, "tp-ep"),
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": (True, "tp-ep-pp"),
}


N_LAYOUTS = 2000


@pytest.fixture(scope="module")
def m():
    return mcore()


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _layout(rng: random.Random, max_w: int, valid: bool = True, **extra) -> ParallelLayout:
    tp, pp, cp = rng.choice([1, 1, 2, 4, 8]), rng.choice([1, 1, 2, 3, 4, 8]), rng.choice([1, 1, 2, 4])
    room = max(1, max_w // (tp * pp * cp))
    dp = max(1, min(room, int(2 ** rng.uniform(0, math.log2(room) + 0.999))))
    w = tp * pp * cp * dp
    etp = rng.choice([d for d in _divisors(w // pp) if d <= 8])
    ep = rng.choice(_divisors(w // (pp * etp)))
    if not valid:  # break one product now and then
        w += rng.choice([0, 0, 1, rng.randint(1, 7)])
        ep = ep if rng.random() < 0.7 else rng.randint(1, 6)
    vpp = rng.choice([None, None, 2, 3]) if (pp > 1 or not valid) else None
    return ParallelLayout(MEGATRON, w, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, **extra)


def _order(rng: random.Random) -> str:
    if rng.random() < 0.7:
        return DEFAULT_ORDER
    toks = ["tp", "cp", "ep", "dp", "pp"]
    rng.shuffle(toks)
    return "-".join(toks)


def test_groups_match_rank_generator(m):
    rg, rng = m.parallel_state.RankGenerator, random.Random(11)
    cases = compared = 0
    while cases < N_LAYOUTS:
        lay, order = _layout(rng, 2 ** rng.randint(2, 10)), _order(rng)  # W up to 4, 8, ..., 1,024
        if layout_check(lay, order) is not None:
            continue
        ours = megatron_ranks(lay, order)
        dense = rg(tp=lay.tp, ep=1, dp=lay.dp_size, pp=lay.pp, cp=lay.cp, order=order)
        expert = rg(tp=lay.etp, ep=lay.ep, dp=lay.expert_dp_size, pp=lay.pp, cp=1, order=order)
        theirs = {kind: dense.get_ranks(kind) for kind in DENSE_GROUPS}
        theirs_e = {kind: expert.get_ranks(kind) for kind in EXPERT_GROUPS}
        for kind, want in theirs.items():
            assert ours.groups(kind).tolist() == want, (lay, order, kind)
        for kind, want in theirs_e.items():
            assert ours.expert_groups(kind).tolist() == want, (lay, order, kind)
        compared += len(theirs) + len(theirs_e)
        # a rank's coordinate is its place in megatron-core's group of that kind
        for name in ("tp", "cp", "dp", "pp"):
            _assert_coords(ours.coords[name], theirs[name])
        for name, kind in [("ep", "ep"), ("etp", "tp"), ("edp", "dp")]:
            _assert_coords(ours.coords[name], theirs_e[kind])
        cases += 1
    assert compared == N_LAYOUTS * 14


def _assert_coords(coords: np.ndarray, groups: list[list[int]]) -> None:
    want = np.empty_like(coords)
    for g in groups:
        want[g] = np.arange(len(g))
    assert np.array_equal(coords, want)


def test_initialize_model_parallel_groups_and_checks(m):
    rng, ok, failed, seen = random.Random(12), 0, 0, set()
    for _ in range(160):
        lay, order = _layout(rng, 256, valid=rng.random() < 0.6), _order(rng)
        kwargs = dict(
            tensor_model_parallel_size=lay.tp,
            pipeline_model_parallel_size=lay.pp,
            virtual_pipeline_model_parallel_size=lay.vpp,
            context_parallel_size=lay.cp,
            expert_model_parallel_size=lay.ep,
            expert_tensor_parallel_size=lay.etp,
            order=order,
        )
        bad = layout_check(lay, order)
        try:
            made = init_model_parallel(m, lay.world_size, **kwargs)
        except (RuntimeError, AssertionError) as e:
            assert bad is not None, (lay, order, e)
            assert (bad.error, bad.message) == (type(e).__name__, str(e))
            seen.add(re.sub(r"\(\d+\)|\d+$", "N", bad.message)[:70])
            failed += 1
            continue
        assert bad is None, (lay, order, bad)
        ours = megatron_ranks(lay, order)
        for desc, (expert, kind) in MCORE_GROUPS.items():
            want = ours.expert_groups(kind) if expert else ours.groups(kind)
            assert made[desc] == want.tolist(), (lay, order, desc)
        assert made["EMBEDDING_GROUP"] == ours.embedding_groups()
        ok += 1
    assert ok > 40 and failed > 40
    # every check of initialize_model_parallel came up: W, VPP, expert W, the DP-size and the PP-groups asserts
    assert len(seen) == 5, seen


def test_generator_checks(m):
    rg = m.parallel_state.RankGenerator
    for args, order in [((1, 2, 2, 1, 2), DEFAULT_ORDER), ((2, 1, 2, 2, 1), "tp-dp"), ((1, 1, 1, 1, 1), "tp-dp")]:
        ours = generator_check(*args, order=order)
        try:
            rg(*args, order=order)
        except (AssertionError, RuntimeError) as e:
            assert ours is not None and (ours.error, ours.message) == (type(e).__name__, str(e))
        else:
            assert ours is None


def test_data_rank_and_output_ranks_follow_verl(m):
    rg, rng = m.parallel_state.RankGenerator, random.Random(13)
    for i in range(300):
        lay = _layout(rng, 512, dynamic_context_parallel=i % 3 == 0)
        if layout_check(lay) is not None:
            continue
        ours = megatron_ranks(lay)
        dense = rg(tp=lay.tp, ep=1, dp=lay.dp_size, pp=lay.pp, cp=lay.cp, order=DEFAULT_ORDER)
        place = {k: _places(dense.get_ranks(k), lay.world_size) for k in ("tp", "cp", "dp", "pp")}
        # MegatronEngine.is_mp_src_rank_with_outputs and get_data_parallel_rank, rank by rank
        dyn = lay.dynamic_context_parallel
        collect = [
            r
            for r in range(lay.world_size)
            if place["tp"][r] == 0
            and place["pp"][r] == lay.pp - 1
            and place["cp"][r] == 0
            and (not dyn or place["dp"][r] == 0)
        ]
        assert sorted(ours.output_ranks.tolist()) == collect
        assert len(collect) == lay.trainer_dp_size
        for d in range(lay.trainer_dp_size):
            rows = [r for r in range(lay.world_size) if (0 if dyn else place["dp"][r]) == d]
            assert ours.same_rows(d) == rows
            assert len(rows) == lay.world_size // lay.trainer_dp_size


def _places(groups: list[list[int]], w: int) -> list[int]:
    out = [0] * w
    for g in groups:
        for i, r in enumerate(g):
            out[r] = i
    return out


def test_worked_example():
    r = megatron_ranks(ParallelLayout(MEGATRON, 16, tp=2, pp=2, cp=2))
    assert r.output_ranks.tolist() == [8, 12]
    assert r.same_rows(0) == [0, 1, 2, 3, 8, 9, 10, 11]
    # 13 = tp 1 + 2·cp 0 + 4·dp 1 + 8·pp 1; experts (ETP 1, EP 1, EDP 8): 13 = edp 5 + 8·pp 1
    assert r.rank_summary(13) == {
        "tp": 1,
        "cp": 0,
        "dp": 1,
        "pp": 1,
        "ep": 0,
        "etp": 0,
        "edp": 5,
        "data_rank": 1,
        "returns_outputs": False,
    }
    assert r.group_of("dp-cp", 5) == [1, 3, 5, 7]
    assert r.group_of("ep", 5, expert=True) == [5]


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="megatron tp must be a positive integer, got 0"):
        layout_check(ParallelLayout(MEGATRON, 8, tp=0))
    with pytest.raises(ValueError, match="order 'tp-xx' must join distinct tokens"):
        layout_check(ParallelLayout(MEGATRON, 8), order="tp-xx")
    with pytest.raises(ValueError, match=r"RuntimeError: world_size \(12\) is not divisible by 8 \(W = 12"):
        megatron_ranks(ParallelLayout(MEGATRON, 12, tp=2, pp=2, cp=2))


def test_fast():
    lay = ParallelLayout(MEGATRON, 1024, tp=8, pp=8, vpp=2, ep=8, etp=1)

    def once() -> float:
        t = time.perf_counter()
        r = megatron_ranks(lay)
        r.coords, r.output_ranks, r.embedding_groups()
        for k in DENSE_GROUPS:
            r.groups(k)
        for k in EXPERT_GROUPS:
            r.expert_groups(k)
        return time.perf_counter() - t

    best = min(once() for _ in range(3))
    assert best < 0.005, f"1,024 GPUs took {best * 1e3:.2f} ms"
