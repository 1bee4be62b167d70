"""Behaviours no other test pinned (each test kills a mutant that survived the suite), against verl's own code.

1. ``balance_batch`` on >= 48 DP ranks (labkit's numpy fast path) with B x n not divisible by D: verl's E38 text.
2. E11 at its boundary (W=8, sp=2, deprecated actor.ppo_micro_batch_size 3/4/5/8) == verl's ``validate_config``.
3. ``trainer.critic_warmup=1``: the actor still updates at step 1 (verl tests ``critic_warmup > global_steps``
   with global_steps = 1); only >= 2 skips the actor-update checks. Both profiles, and the v1 padding multiple.
4. The deprecated ``critic.forward_micro_batch_size``: not checked at start-up (same as ``validate_config``);
   the legacy CriticWorker floor-divides it by the DP size into the compute_values micro size (run from verl
   0.7.1's own ``CriticWorker.__init__`` source); the engine critic ignores it.
5. ``DataProto.union`` with NaN on one side and a number on the other (object arrays): rejected as verl rejects it.

verl's ``validate_config`` runs in the subprocess oracle of ``test_validate_parity`` (0.9.1 from the venv,
0.7.1 from ``.oracle/verl-0.7.1``), once for all the configs of this module.
"""

from __future__ import annotations

import ast
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from labkit.balance import balance_batch as LB
from labkit.balance.kk import NUMPY_MIN_K
from labkit.config.verl_config import SEED_EXAMPLE, load_config
from labkit.plan.step import plan
from labkit.validate.report import check

ROOT = Path(__file__).resolve().parent.parent
ORACLE_071 = ROOT / ".oracle" / "verl-0.7.1"
A, C = "actor_rollout_ref.actor", "critic"

VSB = pytest.importorskip("verl.utils.seqlen_balancing", reason="verl 0.9.1 (test oracle) is not installed")


def outcome(fn, *args, **kwargs):
    """What a call returns, or (exception type, message) if it raises."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the exception is what is compared
        return (type(err).__name__, str(err))


def cfg_of(overrides, profile):
    """A config; engine ones follow the v0 loop (trainer.use_v1=false) unless the overrides set the flag."""
    overrides = list(SEED_EXAMPLE) + list(overrides)
    if profile == "engine" and not any(o.startswith("trainer.use_v1=") for o in overrides):
        overrides.append("trainer.use_v1=false")
    return load_config(overrides=overrides, profile=profile)


def startup_error(cfg):
    """labkit's first start-up error as [type, message] (None when start-up passes)."""
    first = next((f for f in check(cfg, fixes=False).errors if f.when == "start-up"), None)
    return None if first is None else [first.exc_type, first.message]


# ---- verl's validate_config, once for every config of this module ------------------------------------------------
E11_BASE = [
    "trainer.n_gpus_per_node=8",
    "data.train_batch_size=120",
    f"{A}.ppo_mini_batch_size=120",
    f"{A}.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.model.use_remove_padding=true",
    f"~{A}.ppo_micro_batch_size_per_gpu",
]
E11_CASES = [  # (deprecated ppo_micro_batch_size, sp, fires?): 120 is divisible by each, so E10 never fires first
    (3, 2, True),
    (4, 2, False),
    (5, 2, False),
    (8, 2, False),
    (4, 1, True),
    (6, 1, True),
    (8, 1, False),
    (1, 4, True),
    (2, 4, False),
]

# W=8, B=64, n=4, M=64: M' = 32 per rank, every micro size below divides it; the critic is on (GAE)
FWD_BASE = [
    "trainer.n_gpus_per_node=8",
    "data.train_batch_size=64",
    "actor_rollout_ref.rollout.n=4",
    f"{A}.ppo_mini_batch_size=64",
    "algorithm.adv_estimator=gae",
    "critic.model.use_remove_padding=true",
]
FWD_CASES = [  # critic overrides; critic.ppo_micro_batch_size=8 needs per_gpu=null (else E14: it interpolates)
    [f"{C}.ppo_micro_batch_size=8", f"{C}.ppo_micro_batch_size_per_gpu=null"],
    [f"{C}.ppo_micro_batch_size=8", f"{C}.ppo_micro_batch_size_per_gpu=null", f"{C}.forward_micro_batch_size=4"],
    [f"{C}.ppo_micro_batch_size=8", f"{C}.ppo_micro_batch_size_per_gpu=null", f"{C}.forward_micro_batch_size=16"],
    [f"{C}.ppo_micro_batch_size=8", f"{C}.ppo_micro_batch_size_per_gpu=null", f"{C}.forward_micro_batch_size=24"],
    [f"{C}.ppo_micro_batch_size=8", f"{C}.ppo_micro_batch_size_per_gpu=null", f"{C}.forward_micro_batch_size=7"],
    [f"{C}.ppo_micro_batch_size_per_gpu=4"],
    [f"{C}.ppo_micro_batch_size_per_gpu=4", f"{C}.forward_micro_batch_size=3"],
    [
        f"{C}.ppo_micro_batch_size_per_gpu=4",
        f"{C}.forward_micro_batch_size=3",
        f"{C}.forward_micro_batch_size_per_gpu=2",
    ],
]


def _oracle_configs(profile):
    cfgs = [
        cfg_of(E11_BASE + [f"{A}.ppo_micro_batch_size={u}", f"{A}.ulysses_sequence_parallel_size={sp}"], profile)
        for u, sp, _ in E11_CASES
    ]
    return cfgs + [cfg_of(FWD_BASE + case, profile) for case in FWD_CASES]


@pytest.fixture(scope="module")
def verl_startup():
    """{profile: [verl's validate_config error [type, message] or None, one per _oracle_configs(profile)]}."""
    pytest.importorskip("omegaconf")
    from test_validate_parity import _run_oracles

    profiles = ["engine"] + (["legacy"] if (ORACLE_071 / "verl").is_dir() else [])
    jobs = {
        p: [
            {"values": dict(c.values), "ref": c.need_reference_policy, "critic": c.need_critic}
            for c in _oracle_configs(p)
        ]
        for p in profiles
    }
    answers = _run_oracles(jobs)
    want = {"engine": "0.9.1", "legacy": "0.7.1"}
    assert {p: answers[p]["version"] for p in profiles} == {p: want[p] for p in profiles}
    return {p: [r["error"] for r in answers[p]["results"]] for p in profiles}


def _need(verl_startup, profile):
    if profile not in verl_startup:
        pytest.skip(f"{ORACLE_071} is absent (make venv unpacks verl 0.7.1 there)")
    return verl_startup[profile]


# ---- 1. _balance_batch on >= 48 ranks, B x n not divisible by D ----------------------------------------------------
@pytest.fixture(scope="module")
def verl_balance_batch():
    """verl 0.9.1's RayPPOTrainer._balance_batch compiled from its source (ray_trainer.py needs torchdata)."""
    from _oracle_legacy import load_function
    from verl.protocol import DataProto

    path = Path(VSB.__file__).parents[1] / "trainer" / "ppo" / "ray_trainer.py"
    ns = {
        "torch": torch,
        "np": np,
        "DataProto": DataProto,
        "calculate_workload": VSB.calculate_workload,
        "get_seqlen_balanced_partitions": VSB.get_seqlen_balanced_partitions,
        "log_seqlen_unbalance": VSB.log_seqlen_unbalance,
    }
    method = load_function(path, "_balance_batch", ns, cls="RayPPOTrainer")

    def run(seqlens, dp_size, keep_minibatch=False, mini=None):
        mask = torch.arange(max(seqlens) + 2)[None, :] < torch.tensor(seqlens).reshape(-1, 1)
        batch = types.SimpleNamespace(batch={"attention_mask": mask}, non_tensor_batch={}, rows=None)
        batch.reorder = lambda idx: setattr(batch, "rows", idx.tolist())
        arr = types.SimpleNamespace(actor={"ppo_mini_batch_size": mini})
        trainer = types.SimpleNamespace(
            _get_dp_size=lambda wg, role: dp_size,
            actor_rollout_wg=None,
            use_prefix_grouper=False,
            config=types.SimpleNamespace(actor_rollout_ref=arr),
        )
        metrics = {}
        method(trainer, batch, metrics, keep_minibatch=keep_minibatch)
        return batch.rows, metrics

    return run


def _labkit_balance(seqlens, dp_size, keep_minibatch=False, mini=None):
    res = LB.balance_batch(seqlens, dp_size, keep_minibatch=keep_minibatch, ppo_mini_batch_size=mini)
    return res.global_idx, res.metrics


@pytest.mark.parametrize("rows, dp", [(50, 48), (97, 48), (100, 64), (130, 64), (200, 96), (4 * 96 + 1, 96)])
def test_many_rank_balance_not_divisible_raises_verls_e38(verl_balance_batch, rows, dp):
    """D >= 48 would take the numpy path; an uneven B x n must still give verl's karmarkar_karp assert (E38),
    not a numpy reshape error."""
    assert dp >= NUMPY_MIN_K
    seqlens = [(i * 37) % 1500 + 1 for i in range(rows)]
    want = ("AssertionError", f"{rows} % {dp} != 0")
    assert outcome(verl_balance_batch, seqlens, dp) == want
    assert outcome(_labkit_balance, seqlens, dp) == want
    assert outcome(LB.get_seqlen_balanced_partitions, LB.calculate_workload(seqlens), dp, True) == want
    # keep_minibatch=True: the same assert from a mini-batch slice (B x n divisible, the slice of M rows not)
    n = 2 * dp
    seqlens = [(i * 53) % 900 + 1 for i in range(2 * n)]
    mini = n + 1
    want = ("AssertionError", f"{mini} % {dp} != 0")
    assert outcome(verl_balance_batch, seqlens, dp, True, mini) == want
    assert outcome(_labkit_balance, seqlens, dp, True, mini) == want


def test_many_rank_balance_divisible_neighbours_match_verl(verl_balance_batch):
    """The even neighbours of the cases above balance exactly like verl (the numpy path is the one exercised)."""
    for rows, dp in [(48, 48), (96, 48), (128, 64), (192, 96)]:
        seqlens = [(i * 37) % 1500 + 1 for i in range(rows)]
        assert _labkit_balance(seqlens, dp) == verl_balance_batch(seqlens, dp), (rows, dp)


def test_e38_step1_finding_on_many_ranks():
    """The step-1 report names the same E38 text for 48+ DP ranks (dynamic bsz: start-up does not divide by W)."""
    cfg = cfg_of(
        [
            "trainer.n_gpus_per_node=8",
            "trainer.nnodes=6",
            "data.train_batch_size=49",
            "actor_rollout_ref.rollout.n=1",
            f"{A}.use_dynamic_bsz=true",
            f"{A}.ppo_mini_batch_size=49",
            "actor_rollout_ref.rollout.agent.num_workers=1",
            f"~{A}.ppo_micro_batch_size_per_gpu",
        ],
        "legacy",
    )
    e38 = [f for f in check(cfg, fixes=False).errors if f.code == "E38"]
    assert [(f.exc_type, f.message) for f in e38] == [("AssertionError", "49 % 48 != 0")]
    assert outcome(VSB.get_seqlen_balanced_partitions, VSB.calculate_workload(torch.arange(1, 50)), 48, True) == (
        "AssertionError",
        "49 % 48 != 0",
    )


# ---- 2. E11 at its boundary ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_e11_boundary_matches_validate_config(verl_startup, profile):
    """ppo_micro_batch_size x sp >= W passes (4 x 2 = 8 with W = 8), below it verl's ValueError; sp counts."""
    verl = _need(verl_startup, profile)[: len(E11_CASES)]
    for (u, sp, fires), cfg, want in zip(E11_CASES, _oracle_configs(profile), verl):
        text = f"ppo_micro_batch_size ({u}) * ulysses_sequence_parallel_size ({sp}) must be >= n_gpus (8)"
        assert want == (["ValueError", text] if fires else None), (u, sp, want)
        assert startup_error(cfg) == want, (u, sp)
        e11 = [f for f in check(cfg, fixes=False).checks if f.code == "E11"]
        assert [f.severity for f in e11] == ["error" if fires else "pass"], (u, sp)
        assert e11[0].arithmetic == [f"{u} x {sp} = {u * sp} {'<' if fires else '>='} 8"]


# ---- 3. trainer.critic_warmup -------------------------------------------------------------------------------------
WARM_BASE = {  # the actor's update is the only thing that goes wrong at step 1
    "engine": [f"{A}.ppo_mini_batch_size=25", f"{A}.ppo_micro_batch_size_per_gpu=10", "trainer.use_v1=false"],
    "legacy": [f"{A}.ppo_mini_batch_size=25", f"{A}.ppo_micro_batch_size_per_gpu=10"],
}
ACTOR_UPDATE = {
    "engine": [("E29", "error", "120 % 50 != 0")],  # rows 720/6 = 120, mini 25 x 12 / 6 = 50
    "legacy": [
        ("S1", "silent", "actor update: 120 rows per rank split into mini-batches 2 x 50 + 1 x 20 (last one ragged)"),
        ("S2", "silent", "last mini-batch: 2 micro-batches (2 x 10) each scaled 1/GA = 1/5"),
    ],
}


def _actor_step1(cfg):
    return [
        (f.code, f.severity, f.message)
        for f in check(cfg, fixes=False).findings
        if f.when == "step 1" and f._role == "actor"
    ]


def test_verl_updates_the_actor_when_critic_warmup_le_global_steps():
    """The rule labkit models, read from verl: step 1 is global_steps 1, the actor update is skipped while
    critic_warmup > global_steps (v0 loop) / runs when critic_warmup <= global_steps (v1 loop)."""
    import verl

    v0 = (Path(verl.__file__).parent / "trainer" / "ppo" / "ray_trainer.py").read_text()
    v1 = (Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py").read_text()
    assert "# we start from step 1\n        self.global_steps += 1" in v0
    assert "if self.config.trainer.critic_warmup > self.global_steps:" in v0
    assert "if self.config.trainer.critic_warmup <= self.global_steps:" in v1


@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_critic_warmup_one_still_updates_the_actor_at_step_1(profile):
    """critic_warmup 0 and 1: the actor-update findings of step 1 are reported; 2 and 3: they are not (N4)."""
    for warm in (0, 1, 2, 3):
        cfg = cfg_of(WARM_BASE[profile] + [f"trainer.critic_warmup={warm}"], profile)
        got = _actor_step1(cfg)
        if warm <= 1:
            assert got == ACTOR_UPDATE[profile], (profile, warm, got)
        else:
            assert got == [("N4", "notice", f"trainer.critic_warmup = {warm}: the actor is not updated at step 1")]
            assert check(cfg, fixes=False, global_step=1).ok
            later = check(cfg, fixes=False).errors  # what the first update raises, at its step
            assert all(f.when == f"step {warm}" for f in later), [(f.code, f.when) for f in later]


@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_critic_warmup_skips_only_the_actor(profile):
    """With a critic, warm-up skips the actor update only: the critic's step-1 checks stay."""
    over = [
        "algorithm.adv_estimator=gae",
        "critic.model.use_remove_padding=true",
        f"{C}.ppo_micro_batch_size_per_gpu=10",
        f"{C}.ppo_mini_batch_size=25",
    ] + WARM_BASE[profile]

    def critic_step1(warm):
        report = check(cfg_of(over + [f"trainer.critic_warmup={warm}"], profile), fixes=False)
        return [(f.code, f.severity, f.message) for f in report.findings if f.when == "step 1" and f._role == "critic"]

    assert critic_step1(1) == critic_step1(2) != []
    assert _actor_step1(cfg_of(over + ["trainer.critic_warmup=1"], profile))[0][0] in ("E29", "S1")
    assert [c for c, *_ in _actor_step1(cfg_of(over + ["trainer.critic_warmup=2"], profile))] == ["N4"]


def test_plan_notes_the_first_actor_update_step():
    """Step 1 of a warm-up: update_actor is not run (no rank, no error) and says when it first runs."""
    from labkit.plan.step import plan

    for profile in ("engine", "legacy"):
        for warm in (0, 1, 2, 3):
            tr = plan(cfg_of([f"trainer.critic_warmup={warm}"], profile))
            rec = tr.stage("update_actor")
            skipped = f"not run: critic_warmup = {warm} > global step 1" in rec.formula
            assert skipped is (warm > 1) and (tr.at("update_actor") == []) is (warm > 1), (profile, warm)
            assert (f"first updated at step {warm}" in rec.note) is (warm > 1), (profile, warm, rec.note)


def test_v1_padding_multiple_at_the_warmup_boundary():
    """0.9.1's v1 loop pads to lcm(D, M x n) only when the actor updates at step 1: critic_warmup <= 1.
    Compared with verl's own PPOTrainer._get_required_batch_multiple (global_steps = 1)."""
    import verl
    from _oracle_legacy import load_function
    from omegaconf import OmegaConf

    src = Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
    required = load_function(src, "_get_required_batch_multiple", {"math": math}, cls="PPOTrainer")
    B, n, gpn, M = 60, 12, 6, 25  # B x n = 720; lcm(6, 300) = 300 -> pad 180; lcm(6) = 6 -> no pad
    for warm in (0, 1, 2):
        stub = types.SimpleNamespace(
            use_critic=False,
            global_steps=1,
            config=OmegaConf.create(
                {
                    "trainer": {"critic_warmup": warm},
                    "critic": {"ppo_mini_batch_size": M},
                    "actor_rollout_ref": {"rollout": {"n": n}, "actor": {"ppo_mini_batch_size": M}},
                }
            ),
        )
        multiple = required(stub, gpn)
        pad = -(B * n) % multiple
        cfg = cfg_of(
            [
                f"{A}.ppo_mini_batch_size={M}",
                f"{A}.ppo_micro_batch_size_per_gpu=10",
                f"trainer.critic_warmup={warm}",
                "trainer.use_v1=true",
            ],
            "engine",
        )
        v1 = [f for f in check(cfg, fixes=False).findings if f.code == "N6"]
        assert (multiple, pad) == ((300, 180) if warm <= 1 else (6, 0)), warm
        assert plan(cfg).summary["padding_rows"] == pad
        if pad:
            assert len(v1) == 1 and v1[0].arithmetic[1].endswith(f"= {multiple}")
            assert v1[0].arithmetic[2] == f"pad = -{B * n} % {multiple} = {pad} synthetic rows of 128 tokens"
        else:
            assert v1 == []


# ---- 4. critic.forward_micro_batch_size (deprecated) --------------------------------------------------------------
@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_forward_micro_batch_size_not_checked_at_startup(verl_startup, profile):
    """validate_config never reads critic.forward_micro_batch_size: labkit's start-up verdict equals verl's."""
    verl = _need(verl_startup, profile)[len(E11_CASES) :]
    cfgs = _oracle_configs(profile)[len(E11_CASES) :]
    for case, cfg, want in zip(FWD_CASES, cfgs, verl):
        assert startup_error(cfg) == want, (case, want)
    assert verl == [None] * len(FWD_CASES)  # the cases are start-up clean, so later stages are what differs


def _verl071_critic_normalise(cfg):
    """verl 0.7.1's CriticWorker.__init__ normalisation block, run on the config's critic values (world W)."""
    path = ORACLE_071 / "verl" / "workers" / "fsdp_workers.py"
    cls = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "CriticWorker")
    body = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__").body
    start = next(i for i, s in enumerate(body) if ast.unparse(s).startswith("self.config.ppo_mini_batch_size *="))
    block = body[start : start + 4]  # mini *= n; mini //= D; if micro is not None: (divide, copy); if per_gpu: asserts
    assert "forward_micro_batch_size //=" in ast.unparse(block[2])
    keys = (
        "ppo_mini_batch_size",
        "ppo_micro_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "forward_micro_batch_size",
        "forward_micro_batch_size_per_gpu",
    )
    conf = types.SimpleNamespace(
        rollout_n=cfg.get("actor_rollout_ref.rollout.n"), **{k: cfg.get(f"critic.{k}") for k in keys}
    )
    sp = cfg.get("critic.ulysses_sequence_parallel_size")
    me = types.SimpleNamespace(config=conf, ulysses_sequence_parallel_size=sp)
    W = cfg.n_gpus
    ns = {"self": me, "torch": types.SimpleNamespace(distributed=types.SimpleNamespace(get_world_size=lambda: W))}
    exec(compile(ast.Module(block, []), str(path), "exec"), ns)  # noqa: S102 - verl's own code as the oracle
    return conf.forward_micro_batch_size_per_gpu  # CriticWorker.compute_values' micro_batch_size


def _verl_compute_values_split(rows, micro):
    """What dp_critic.compute_values' data.split(micro) gives on one rank: piece sizes, or the exception."""
    from verl.protocol import DataProto

    data = DataProto.from_dict({"x": torch.zeros(rows, 1)})
    return outcome(lambda: [len(p) for p in data.split(micro)])


@pytest.mark.skipif(not (ORACLE_071 / "verl").is_dir(), reason="verl 0.7.1 oracle absent")
def test_legacy_forward_micro_batch_size_normalisation_matches_verl071():
    """Legacy: with critic.ppo_micro_batch_size set, forward_micro_batch_size // (W // sp) becomes the
    compute_values micro size (4 // 8 = 0 -> split(0) fails; 24 // 8 = 3 -> ragged; 16 // 8 = 2); with only
    *_per_gpu set it is ignored. Piece sizes and errors are verl's DataProto.split on the normalised size."""
    rows = 64 * 4 // 8
    expected_micro = {1: 1, 2: 0, 3: 2, 4: 3, 5: 0, 6: 4, 7: 4, 8: 2}
    for i, case in enumerate(FWD_CASES):
        cfg = cfg_of(FWD_BASE + case, "legacy")
        micro = _verl071_critic_normalise(cfg)
        assert micro == expected_micro[i + 1], (case, micro)
        verl = _verl_compute_values_split(rows, micro)
        report = check(cfg, fixes=False)
        cv = [
            f
            for f in report.checks
            if f._role == "critic"
            and f.when == "step 1"
            and f.code in ("X2", "X3", "S3")
            and "compute_values" in f.where
        ]
        fired = [(f.code, f.exc_type, f.message) for f in cv if f.severity != "pass"]
        if isinstance(verl, tuple):  # verl raises in data.split
            assert fired == [("X2", verl[0], verl[1])], case
            assert report.first_error.code == "X2" and "compute_values" in report.first_error.where
            continue
        ragged = len(set(verl)) > 1
        s3 = [f for f in cv if f.code == "S3"]
        assert len(s3) == 1 and s3[0].severity == ("silent" if ragged else "pass"), case
        assert [c for c, *_ in fired] == (["S3"] if ragged else []), case
        pieces = f"{len(verl)} micro-batches" + (
            f": {verl.count(verl[0])} x {verl[0]} + 1 x {verl[-1]}" if ragged else f" of {micro}"
        )
        assert pieces in s3[0].arithmetic[0], (case, s3[0].arithmetic, verl)
        assert report.ok, (case, report.first_error)


def test_engine_critic_ignores_forward_micro_batch_size():
    """Engine (0.9.1): the critic engine micro-batches dynamically (N3); forward_micro_batch_size changes nothing."""

    def findings(case):
        return [
            (f.code, f.severity, f.when, f.message)
            for f in check(cfg_of(FWD_BASE + case, "engine"), fixes=False).findings
        ]

    assert findings(FWD_CASES[1]) == findings(FWD_CASES[0]) == findings(FWD_CASES[3])
    assert findings(FWD_CASES[6]) == findings(FWD_CASES[5])
    assert "N3" in [c for c, *_ in findings(FWD_CASES[1])]


def test_legacy_null_forward_micro_batch_size_fails_at_worker_init_like_verl071():
    """verl 0.7.1's CriticWorker floor-divides forward_micro_batch_size even when it is null: X8 at worker init."""
    cfg = cfg_of(FWD_BASE + FWD_CASES[0] + [f"{C}.forward_micro_batch_size=null"], "legacy")
    verl = outcome(_verl071_critic_normalise, cfg)
    assert verl == ("TypeError", "unsupported operand type(s) for //=: 'NoneType' and 'int'")
    first = check(cfg, fixes=False).first_error
    assert (first.code, first.when, first.exc_type, first.message) == ("X8", "worker init", *verl)
    dynamic = cfg_of(
        FWD_BASE + FWD_CASES[0] + [f"{C}.forward_micro_batch_size=null", f"{C}.use_dynamic_bsz=true"], "legacy"
    )
    assert outcome(_verl071_critic_normalise, dynamic) == verl  # the division does not look at use_dynamic_bsz
    assert check(dynamic, fixes=False).first_error.code == "X8"


# ---- 5. DataProto.union: NaN against a number in object arrays ----------------------------------------------------
VP = pytest.importorskip("verl.protocol")

NAN_CASES = [  # (left non-tensor values, right values): one side NaN, the other a number -> rejected
    ([float("nan"), "s"], [1.0, "s"]),
    ([1.0, "s"], [float("nan"), "s"]),
    (["s", np.float64("nan")], ["s", np.float64(2.5)]),
    ([np.float64(0.0), None], [np.float64("nan"), None]),
    ([float("nan"), 3], [1, 3]),  # float against int: the types differ
    ([float("nan"), float("nan")], [float("nan"), 0.0]),
]
NAN_OK = [([float("nan"), "s"], [float("nan"), "s"]), ([np.float64("nan")], [np.float64("nan")])]  # accepted


def _proto(mod, values, numeric=False):
    arr = np.asarray(values, dtype=np.float64) if numeric else np.empty(len(values), dtype=object)
    if not numeric:
        arr[:] = values
    return mod.DataProto.from_dict(
        tensors={"x": torch.arange(len(values))}, non_tensors={"k": arr, "same": arr.copy()}, meta_info={"m": 1}
    )


@pytest.mark.parametrize(
    "left, right, accepted", [(a, b, False) for a, b in NAN_CASES] + [(a, b, True) for a, b in NAN_OK]
)
def test_union_nan_against_number_matches_verl(left, right, accepted):
    from labkit.protocol import data_proto as LP

    mine, ref = (
        outcome(lambda: _proto(LP, left).union(_proto(LP, right))),
        outcome(lambda: _proto(VP, left).union(_proto(VP, right))),
    )
    if accepted:
        assert not isinstance(ref, tuple) and not isinstance(mine, tuple)
        assert list(mine.non_tensor_batch) == list(ref.non_tensor_batch) == ["k", "same"]
    else:
        want = ("AssertionError", "`k` in tensor_dict1 and tensor_dict2 are not the same object.")
        assert ref == want and mine == want, (mine, ref)


def test_union_nan_in_float_arrays_matches_verl():
    """Numeric (float64) non-tensors: NaN == NaN, NaN != 1.0, exactly as verl's np.array_equal(equal_nan=True)."""
    from labkit.protocol import data_proto as LP

    for left, right in ([[np.nan, 1.0], [np.nan, 1.0]], [[np.nan, 1.0], [2.0, 1.0]], [[1.0, 2.0], [1.0, np.nan]]):
        mine = outcome(lambda a, b: _proto(LP, a, True).union(_proto(LP, b, True)), left, right)
        ref = outcome(lambda a, b: _proto(VP, a, True).union(_proto(VP, b, True)), left, right)
        assert isinstance(mine, tuple) == isinstance(ref, tuple), (left, right)
        if isinstance(ref, tuple):
            assert mine == ref == ("AssertionError", "`k` in tensor_dict1 and tensor_dict2 are not the same object.")
