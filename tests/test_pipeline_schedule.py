"""labkit.plan.pipeline_schedule against megatron-core 0.16.1's own schedules, run on CPU with the compute stubbed
(tests/_oracle_mcore.py: run_schedule): every stage's (F|B, micro-batch, chunk) order on random (PP, VPP, Mμ, G,
forward_only), the interleaving checks' exceptions and texts, and the pure pieces (get_schedule_table,
get_pp_rank_microbatches, convert_schedule_table_to_order). The timeline is checked on its own terms (every action
starts as soon as its stage is free and its input has arrived) and against the closed-form bubble."""

from __future__ import annotations

import random
import time
from collections import Counter
from fractions import Fraction

import pytest
from _oracle_mcore import FakeP2P, mcore, run_schedule

from labkit.plan.pipeline_schedule import pipeline_schedule, schedule_check, schedule_table, warmup_count

pytestmark = pytest.mark.filterwarnings("ignore")
N_CASES = 600


@pytest.fixture(scope="module")
def m():
    return mcore()


def _random_case(rng: random.Random, valid_only: bool) -> tuple[int, int | None, int, int | None, bool]:
    pp = rng.choice([1, 2, 2, 3, 4, 4, 5, 8])
    vpp = rng.choice([None, None, 1, 2, 3, 4])
    mb = rng.randint(1, 40)
    g = None if rng.random() < 0.5 else rng.randint(1, 12)
    if valid_only and schedule_check(pp, vpp, mb, g):
        g, mb = None, pp * rng.randint(1, 6)  # Mμ a multiple of PP with the default G = PP always passes
    return pp, vpp, mb, g, rng.random() < 0.2


def test_order_matches_megatron_core(m):
    rng, stages, functions = random.Random(1), 0, Counter()
    for _ in range(N_CASES):
        pp, vpp, mb, g, fwd_only = _random_case(rng, valid_only=True)
        ours = pipeline_schedule(pp, vpp, mb, g, forward_only=fwd_only)
        for st in ours.stages:
            theirs = run_schedule(m, pp, st.stage, vpp, mb, g, fwd_only)
            assert st.actions == theirs, (pp, vpp, mb, g, fwd_only, st.stage)
            stages += 1
        assert ours.function == m.schedules.get_forward_backward_func(pp, vpp).__name__
        functions[ours.function, fwd_only] += 1
    assert stages > 2 * N_CASES and len(functions) == 6 and min(functions.values()) > 10, functions


def test_checks_match_megatron_core(m):
    rng, raised, passed = random.Random(2), 0, 0
    for _ in range(400):
        pp, vpp, mb, g, fwd_only = _random_case(rng, valid_only=False)
        ours = schedule_check(pp, vpp, mb, g)
        try:
            run_schedule(m, pp, 0, vpp, mb, g, fwd_only)
        except (ValueError, RuntimeError) as e:
            assert ours is not None, (pp, vpp, mb, g)
            assert (ours.error, ours.message) == (type(e).__name__, str(e))
            raised += 1
        else:
            assert ours is None, (pp, vpp, mb, g, ours)
            passed += 1
    assert raised > 50 and passed > 50
    # both messages, with their exact (sic) text
    assert schedule_check(4, 2, 3).message.endswith("stageshould range in [PP=4 , M=3]")
    bad = schedule_check(4, 2, 10, 4)
    assert bad.error == "RuntimeError" and "but it is 2. Otherwise" in bad.message and "10 % 4 = 2" in bad.arithmetic
    with pytest.raises(ValueError, match="RuntimeError: The remainder of M"):
        pipeline_schedule(4, 2, 10, 4)


def test_pure_pieces_match_megatron_core(m):
    s, rng = m.schedules, random.Random(3)
    for _ in range(300):
        pp, v, mb = rng.randint(2, 8), rng.randint(1, 5), rng.randint(1, 64)
        g = rng.randint(1, mb)
        table = schedule_table(mb, v, g)
        assert table == s.get_schedule_table(mb, v, g)
        for stage in range(pp):
            p2p = FakeP2P(pp, stage, v, None)
            warm = warmup_count(pp, stage, v, mb, g)
            assert warm == s.get_pp_rank_microbatches(mb, v, g, p2p_communicator=p2p)[2]
            all_warm = warmup_count(pp, stage, v, mb, g, forward_only=True)
            assert all_warm == s.get_pp_rank_microbatches(mb, v, g, forward_only=True, p2p_communicator=p2p)[2]
            if schedule_check(pp, v, mb, g) is None and stage in (0, pp - 1):
                acts = pipeline_schedule(pp, v, mb, g).stages[stage].actions
                order = [c + 1 if k == "F" else -(c + 1) for k, _, c in acts]
                assert order == m.convert_schedule_table_to_order(warm, v, table)


def test_phases_and_peak_in_flight():
    rng = random.Random(4)
    for _ in range(300):
        pp, mb = rng.randint(1, 8), rng.randint(1, 40)
        s = pipeline_schedule(pp, None, mb)
        for st in s.stages:
            assert st.peak_in_flight == (1 if pp == 1 else min(pp - st.stage, mb))
            assert st.warmup + st.steady == mb and st.cooldown == st.warmup
            assert [a[0] for a in st.actions].count("F") == mb == [a[0] for a in st.actions].count("B")
        v = rng.randint(1, 4)
        mb = pp * rng.randint(1, 8)
        if pp > 1:
            s = pipeline_schedule(pp, v, mb)
            for st in s.stages:
                assert st.peak_in_flight == min(2 * (pp - st.stage - 1) + (v - 1) * pp + 1, mb * v)
            assert pipeline_schedule(pp, v, mb, forward_only=True).stages[0].peak_in_flight == 0


def test_timeline_is_dataflow_and_matches_the_closed_form_bubble():
    rng = random.Random(5)
    for _ in range(200):
        pp, vpp, mb, g, fwd_only = _random_case(rng, valid_only=True)
        tf, tb = rng.randint(1, 4), rng.randint(1, 4)
        s = pipeline_schedule(pp, vpp, mb, g, forward_only=fwd_only, t_forward=tf, t_backward=tb)
        v = s.chunks
        end = {}
        for st in s.stages:
            for _, t1, k, b, c in st.timeline:
                end[k, c * pp + st.stage, b] = t1
        for st in s.stages:
            free = 0.0
            for t0, t1, k, b, c in st.timeline:
                vs = c * pp + st.stage
                dep = end.get(("F", vs - 1, b), 0.0) if k == "F" else end.get(("B", vs + 1, b), end["F", vs, b])
                assert t1 - t0 == pytest.approx((tf if k == "F" else tb) / v)
                assert t0 == pytest.approx(max(free, dep))  # as soon as the stage is free and the input is there
                free = t1
        work = (tf if fwd_only else tf + tb) * mb
        closed = Fraction(work * (v * mb + pp - 1), v * mb)
        assert Fraction(s.makespan).limit_denominator(10_000) == closed
        assert s.bubble_fraction == pytest.approx(s.closed_form_bubble, abs=1e-12)


def test_p2p_per_micro_batch():
    s = pipeline_schedule(4, 2, 8)
    p = [(x.p2p.recv_forward, x.p2p.send_forward, x.p2p.recv_backward, x.p2p.send_backward) for x in s.stages]
    assert p == [(1, 2, 2, 1), (2, 2, 2, 2), (2, 2, 2, 2), (2, 1, 1, 2)]
    assert (s.stages[0].p2p.prev_stage, s.stages[0].p2p.next_stage) == (3, 1)
    p = [(x.p2p.recv_forward, x.p2p.send_forward, x.p2p.recv_backward) for x in pipeline_schedule(3, None, 5).stages]
    assert p == [(0, 1, 1), (1, 1, 1), (1, 0, 0)]
    assert pipeline_schedule(3, None, 5, forward_only=True).stages[1].p2p.recv_backward == 0


def test_bad_input_is_one_line():
    for args in [(0, None, 4), (2, None, 0), (2, 0, 4), (2, 2, 4.5)]:
        with pytest.raises(ValueError, match="must be a positive integer"):
            pipeline_schedule(*args)
    with pytest.raises(ValueError, match="t_forward and t_backward must be positive"):
        pipeline_schedule(2, None, 4, t_backward=0)


def test_fast():
    best = min(_timed() for _ in range(5))
    assert best < 0.05, f"PP 8, VPP 4, Mμ 256 took {best * 1e3:.1f} ms"


def _timed() -> float:
    t = time.perf_counter()
    pipeline_schedule(8, 4, 256)
    return time.perf_counter() - t
