"""Megatron backend: labkit's checks == verl's and megatron-core's own code on thousands of random Megatron configs.

Oracles (all run their real code; nothing is copied):
* verl 0.9.1 / 0.7.1 ``validate_config`` on ``_generated_ppo_megatron_trainer.yaml`` (subprocesses, the runner of
  tests/test_validate_parity.py pointed at the Megatron YAML, warnings recorded): E2, M1, E1, M2, the SP warning M3,
  then the FSDP-shared checks; first error type and message, and the warnings printed.
* megatron-core 0.16.1 (``.oracle/megatron-core-0.16.1``): ``initialize_model_parallel`` with a fake
  ``torch.distributed`` (stopped at its first process group), ``TransformerConfig(...)``, ``get_num_layers_to_build``,
  ``divide``, and the two ``if`` statements of ``forward_backward_pipelining_with_interleaving`` compiled from its
  source; the bare expert assert of ``MoELayer.__init__`` is read from its source.
* verl 0.9.1 ``prepare_micro_batches`` (compiled from ``verl/workers/engine/utils.py``) and the VPP assert of
  ``MegatronEngine.forward_backward_batch`` (compiled from ``transformer_impl.py``) on real TensorDicts, static and
  dynamic, with ``num_batches_divided_by``; ``get_megatron_dynamic_cp_scheduler_cls`` against megatron-core 0.16.1.
* verl 0.7.1 ``megatron_workers.py``: the normalisation blocks of ``ActorRolloutRefWorker.__init__`` and
  ``CriticWorker.__init__`` compiled from its source and run on the 0.7.1 Megatron YAML with a fake ``mpu``.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import random
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from labkit.config.verl_config import VerlConfig
from labkit.rules import megatron_rules as mr
from labkit.rules import megatron_schedule as ms
from labkit.rules.catalogue import code_of, message_fields
from labkit.validate.batch_sizes import normalized_mini
from labkit.validate.megatron_checks import legacy_init
from labkit.validate.report import check
from labkit.validate.snapshot import Recorder as Run
from labkit.validate.snapshot import Snap

ROOT = Path(__file__).resolve().parent.parent
MCORE = ROOT / ".oracle" / "megatron-core-0.16.1"
ORACLE_071 = ROOT / ".oracle" / "verl-0.7.1"
A, RO, RF, MG = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.actor.megatron",
)
TC = f"{MG}.override_transformer_config"
N_STARTUP = 250  # per profile
N_MCORE = 4000
N_STEP = 500


def _pick(rng: random.Random, *xs):  # noqa: ANN001, ANN202
    return rng.choice(xs)


def megatron_config(rng: random.Random, profile: str, dynamic_cp: bool = True) -> VerlConfig:
    """A random Megatron config: sizes that divide or not, micro sizes, dynamic bsz, recompute, dynamic CP."""
    cfg = VerlConfig(profile=profile).override(["model_engine=megatron"])
    gpn, nnodes = _pick(rng, 1, 2, 4, 6, 8, 8, 8), _pick(rng, 1, 1, 2, 3)
    W = gpn * nnodes
    tp, pp, cp = _pick(rng, 1, 1, 2, 2, 4, 3, 8), _pick(rng, 1, 1, 2, 4, 3), _pick(rng, 1, 1, 1, 2, 4)
    n, B = _pick(rng, 1, 2, 4, 5, 8, 16), _pick(rng, rng.randint(1, 96), 32, 64, 128, 7 * W)
    v = {
        "trainer.n_gpus_per_node": gpn,
        "trainer.nnodes": nnodes,
        "data.train_batch_size": B,
        f"{RO}.n": n,
        f"{MG}.tensor_model_parallel_size": tp,
        f"{MG}.pipeline_model_parallel_size": pp,
        f"{MG}.context_parallel_size": cp,
        f"{A}.ppo_mini_batch_size": _pick(rng, B, max(1, B // 2), max(1, B // 4), rng.randint(1, B + 4)),
        f"{A}.use_kl_loss": rng.random() < 0.4,
        "algorithm.adv_estimator": _pick(rng, "grpo", "gae", "grpo"),
        f"{RO}.log_prob_micro_batch_size_per_gpu": _pick(rng, 1, 2, 4, 8, 16),
        f"{RF}.log_prob_micro_batch_size_per_gpu": _pick(rng, 2, 4, 8),
        "critic.ppo_micro_batch_size_per_gpu": _pick(rng, 1, 2, 4, 8),
    }
    if rng.random() < 0.8:
        v[f"{A}.ppo_micro_batch_size_per_gpu"] = _pick(rng, 1, 2, 3, 4, 8, 16)
    if rng.random() < 0.1:
        v[f"{A}.ppo_micro_batch_size"] = _pick(rng, 4, 8, 2 * W)
    if rng.random() < 0.25:
        v[f"{A}.use_dynamic_bsz"] = True
    if rng.random() < 0.35:
        v[f"{MG}.virtual_pipeline_model_parallel_size"] = _pick(rng, 2, 2, 3, 4)
    if rng.random() < 0.3:
        v[f"{MG}.expert_model_parallel_size"] = _pick(rng, 2, 4, 3)
    if rng.random() < 0.15:
        v[f"{MG}.expert_tensor_parallel_size"] = _pick(rng, 1, 2)
    if rng.random() < 0.3:
        v[f"{MG}.sequence_parallel"] = rng.random() < 0.5
    if rng.random() < 0.2:
        v["critic.megatron.tensor_model_parallel_size"] = _pick(rng, 1, 2)
        v["critic.megatron.sequence_parallel"] = rng.random() < 0.7
    if rng.random() < 0.2:
        v[f"{TC}.recompute_granularity"] = _pick(rng, "full", "selective", "selective", "block")
        v[f"{TC}.recompute_method"] = _pick(rng, None, "uniform", "block", "all")
        v[f"{TC}.recompute_num_layers"] = _pick(rng, None, 1, 2)
        v[f"{TC}.recompute_modules"] = _pick(rng, ["core_attn"], ["mlp", "moe"], ["core_attn", "dropout"])
    if rng.random() < 0.15:
        v[f"{TC}.microbatch_group_size_per_vp_stage"] = _pick(rng, 1, 2, 3, 4, 8)
    if dynamic_cp and profile == "engine" and rng.random() < 0.1:
        v[f"{MG}.dynamic_context_parallel"] = True
        v[f"{MG}.max_seqlen_per_dp_cp_rank"] = _pick(rng, None, 4096)
    for k, val in v.items():
        cfg.set(k, val)
    return cfg


# -- verl validate_config (subprocess, per version) -------------------------------------------------------------------
def _runner() -> str:
    spec = importlib.util.spec_from_file_location("_vp", ROOT / "tests" / "test_validate_parity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.RUNNER
    for old, new in (
        ('"_generated_ppo_trainer.yaml"', '"_generated_ppo_megatron_trainer.yaml"'),
        ('"actor", "ref", "rollout"}', '"actor", "ref", "rollout", "megatron", "override_transformer_config"}'),
        (
            '        with contextlib.redirect_stdout(buf):\n            validate_config(conf, job["ref"], job["critic"])',
            "        with contextlib.redirect_stdout(buf), warnings.catch_warnings(record=True) as _w:\n"
            '            warnings.simplefilter("always")\n'
            "            try:\n"
            '                validate_config(conf, job["ref"], job["critic"])\n'
            "            finally:\n"
            "                for _x in _w:\n"
            '                    print("WARN " + str(_x.message), file=buf)',
        ),
    ):
        assert old in text, old
        text = text.replace(old, new)
    return text


def _start(jobs: dict[str, list[dict]]) -> dict[str, subprocess.Popen]:
    """One oracle subprocess per profile, started now (they run while the in-process tests do)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    procs, runner = {}, _runner()
    for profile, js in jobs.items():
        e = dict(env, **({"PYTHONPATH": str(ORACLE_071)} if profile == "legacy" else {}))
        jobs_file = tempfile.TemporaryFile("w+")  # a file, not a pipe: the child reads it after importing verl
        json.dump(js, jobs_file)
        jobs_file.seek(0)
        p = subprocess.Popen(
            [sys.executable, "-c", runner], stdin=jobs_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=e, cwd=str(ROOT),
        )  # fmt: skip
        jobs_file.close()  # the child holds its own descriptor
        procs[profile] = p
    return procs


def _collect(procs: dict[str, subprocess.Popen]) -> dict[str, dict]:
    out = {}
    for profile, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)  # both pipes at once: a full stderr cannot block the child
        assert p.returncode == 0, f"{profile} oracle failed:\n{stderr[-3000:]}"
        out[profile] = json.loads(stdout)
    return out


@pytest.fixture(scope="module", autouse=True)
def _startup_oracles():
    """Start verl's validate_config subprocesses with the module's first test; ``startup`` collects them."""
    if importlib.util.find_spec("verl") is None or importlib.util.find_spec("omegaconf") is None:
        yield None
        return
    profiles = ["engine"] + (["legacy"] if (ORACLE_071 / "verl").is_dir() else [])
    cfgs = {p: [megatron_config(random.Random(f"{p}{i}"), p) for i in range(N_STARTUP)] for p in profiles}
    jobs = {
        p: [{"values": dict(c.values), "ref": c.need_reference_policy, "critic": c.need_critic} for c in cs]
        for p, cs in cfgs.items()
    }
    procs = _start(jobs)
    yield cfgs, procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def startup(_startup_oracles):
    if _startup_oracles is None:
        pytest.skip("verl 0.9.1 (test oracle) is not installed")
    cfgs, procs = _startup_oracles
    return cfgs, _collect(procs)


# -- megatron-core 0.16.1 (in-process) ---------------------------------------------------------------------------------
class _Reached(Exception):
    """initialize_model_parallel got past its size checks (to its first process group)."""


@pytest.fixture(scope="module")
def mcore():
    if not (MCORE / "megatron").is_dir():
        pytest.skip(f"megatron-core 0.16.1 oracle absent: pip install --no-deps --target {MCORE} megatron-core==0.16.1")
    sys.path.insert(0, str(MCORE))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core import parallel_state, utils
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_config import TransformerConfig
    src = Path(schedules.__file__).read_text()
    fn = next(
        n for n in ast.walk(ast.parse(src)) if getattr(n, "name", "") == "forward_backward_pipelining_with_interleaving"
    )
    ifs = [n for n in fn.body if isinstance(n, ast.If) and "microbatch_group_size_per_vp_stage" in ast.unparse(n.test)]
    ifs += [  # the remainder check follows an assignment
        n for n in fn.body if isinstance(n, ast.Assign) and "final_microbatch_group_size" in ast.unparse(n)
    ] + [n for n in fn.body if isinstance(n, ast.If) and "final_microbatch_group_size" in ast.unparse(n.test)]
    assert len(ifs) == 3, "megatron-core's interleaved schedule checks moved"
    sched = compile(ast.Module(ifs, []), schedules.__file__, "exec")
    moe_src = (MCORE / "megatron/core/transformer/moe/moe_layer.py").read_text()
    assert "assert self.config.num_moe_experts % ep_size == 0\n" in moe_src  # M19: a bare assert
    return SimpleNamespace(
        torch=torch, ps=parallel_state, divide=utils.divide, layers=get_num_layers_to_build, TC=TransformerConfig,
        sched=sched,
    )  # fmt: skip


def _err(fn) -> list | None:  # noqa: ANN001
    try:
        fn()
    except _Reached:
        return None
    except Exception as e:  # noqa: BLE001 - the oracle reports whatever megatron-core raises
        return [type(e).__name__, str(e)]
    return None


def mcore_init(m, W, tp, pp, vpp, cp, ep, etp):  # noqa: ANN001, ANN201
    dist = m.torch.distributed
    with (
        mock.patch.object(dist, "is_initialized", lambda: True),
        mock.patch.object(dist, "get_world_size", lambda *a, **k: W),
        mock.patch.object(dist, "get_rank", lambda *a, **k: 0),
        mock.patch.object(dist, "new_group", side_effect=_Reached),
    ):
        try:
            return _err(lambda: m.ps.initialize_model_parallel(
                tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=vpp, use_sharp=False, context_parallel_size=cp,
                expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, nccl_communicator_config_path=None))  # fmt: skip
        finally:
            m.ps.destroy_model_parallel()


def mcore_model(m, tp, pp, vpp, ep, sp, heads, kv, layers, experts, vocab, rc):  # noqa: ANN001, ANN201
    """TransformerConfig(...) as verl's bridge builds it, then the model build's size checks, on pipeline rank 0."""
    box = {}

    def build() -> None:
        kw = dict(
            num_layers=layers, hidden_size=heads * 8, num_attention_heads=heads, num_query_groups=kv,
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
            expert_model_parallel_size=ep, sequence_parallel=sp, num_moe_experts=experts or None,
            pipeline_dtype=m.torch.bfloat16, add_bias_linear=False, **rc,
        )  # fmt: skip
        if experts:
            kw.update(moe_router_topk=2, moe_ffn_hidden_size=16)
        cfg = m.TC(**kw)
        box["warn"] = True
        m.divide(vocab, tp)  # VocabParallelEmbedding on the first stage
        m.layers(cfg, vp_stage=0 if vpp else None, pp_rank=0)  # the decoder
        if experts and experts % ep:  # MoELayer.__init__'s bare assert (its source is checked above)
            raise AssertionError

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        err = _err(build)
    warned = any("sequence parallelism must be used" in str(x.message) for x in w)
    return err, warned


def _first(verdicts: list[mr.Verdict]) -> list | None:
    f = next((v for v in verdicts if v.fired and v.exc_type), None)
    return [f.exc_type, f.message] if f else None


def test_mesh_and_model_checks_match_megatron_core(mcore):
    rng = random.Random(1616)
    stats: dict[str, int] = {}
    bad = []
    for _ in range(N_MCORE):
        W = _pick(rng, 1, 2, 4, 6, 8, 8, 12, 16, 16, 24, 32, 32, 64)
        tp, pp, cp = _pick(rng, 1, 2, 4, 3, 8), _pick(rng, 1, 2, 4, 3), _pick(rng, 1, 1, 2)
        vpp = _pick(rng, None, None, 1, 2, 3, 4)
        ep, etp = _pick(rng, 1, 1, 2, 4, 3), _pick(rng, None, None, 1, 2)
        want = mcore_init(mcore, W, tp, pp, vpp, cp, ep, etp)
        got = _first(mr.model_parallel_init(W, tp, pp, vpp, cp, ep, etp))
        if got != want:
            bad.append(("init", W, tp, pp, vpp, cp, ep, etp, got, want))
        stats["init " + (want[1][:22] if want else "ok")] = 1 + stats.get("init " + (want[1][:22] if want else "ok"), 0)
        if want is not None or vpp is not None and pp == 1:
            continue
        heads = _pick(rng, 8, 12, 14, 16, 28, 32, 40, 64)
        kv = _pick(rng, None, 1, 2, 4, 8, 3, heads)
        layers, vocab = _pick(rng, 12, 16, 24, 28, 30, 32, 36, 61), _pick(rng, 32000, 151936, 128256, 50257, 32001)
        experts = _pick(rng, 0, 0, 8, 16, 60, 64, 6)  # 0: dense
        sp = tp > 1 and rng.random() < 0.8  # verl turns SP off at TP = 1 (M3)
        rc = {}
        if rng.random() < 0.3:
            rc = {"recompute_granularity": _pick(rng, "full", "selective", "block")}
            rc["recompute_method"] = _pick(rng, None, "uniform", "block", "all")
            rc["recompute_num_layers"] = _pick(rng, None, 1, 2)
            rc["recompute_modules"] = _pick(rng, ["core_attn"], ["mlp", "moe"], ["core_attn", "dropout"])
        want, warned = mcore_model(mcore, tp, pp, vpp, ep, sp, heads, kv, layers, experts, vocab, rc)
        verdicts = mr.transformer_config_checks(
            tp, sp, ep, pp, heads, kv, experts, layers, rc.get("recompute_granularity"), rc.get("recompute_method"),
            rc.get("recompute_num_layers"), rc.get("recompute_modules"),
        ) + mr.model_build_checks(tp, pp, vpp, ep, layers, experts, vocab)  # fmt: skip
        got = _first(verdicts)
        ours_warn = any(v.code == "M10" and v.fired for v in verdicts)
        if want and want[0] == "AssertionError" and want[1].startswith("Invalid choices for recompute_modules"):
            same = got is not None and got[0] == want[0] and code_of(got[1], ("M15",)) == code_of(want[1], ("M15",))
            same = same and {k: eval(v) for k, v in message_fields("M15", got[1]).items()} == {  # noqa: S307
                k: eval(v)
                for k, v in message_fields("M15", want[1]).items()  # noqa: S307 - two set reprs
            }
        else:
            same = got == want
        if not same or warned != ours_warn:
            bad.append(("model", tp, pp, vpp, ep, sp, heads, kv, layers, experts, vocab, rc, got, want, warned))
        key = "model " + (want[1][:24] if want else "ok")
        stats[key] = stats.get(key, 0) + 1
    assert not bad, f"{len(bad)} disagreements; first: {bad[:3]}"
    assert sum(v for k, v in stats.items() if k.startswith("model")) > 800, stats
    assert len(stats) >= 14, stats  # every verdict (pass and each message) is reached


def test_interleaved_schedule_checks_match_megatron_core(mcore):
    rng = random.Random(23)
    n = 0
    for _ in range(2000):
        pp, vpp, count = _pick(rng, 2, 3, 4, 8), _pick(rng, 2, 3), rng.randint(1, 40)
        g = _pick(rng, None, None, 1, 2, 3, 4, 6, 8)
        ns = {
            "config": SimpleNamespace(microbatch_group_size_per_vp_stage=ms.group_size(pp, g)),
            "num_microbatches": count,
            "pipeline_parallel_size": pp,
        }
        want = _err(lambda ns=ns: exec(mcore.sched, ns))  # noqa: S102 - megatron-core's own statements
        assert _first(ms.interleaved_schedule_checks(count, pp, vpp, g)) == want, (pp, count, g)
        dyn, G = ms.dynamic_group_check(pp, vpp, g), ms.group_size(pp, g)
        if dyn.fired:  # certain whatever the dynamic count
            assert want is not None and want[0] == "ValueError", (pp, count, g)
        elif count % G == 0:  # a dynamic count (rounded up to a multiple of G) passes megatron-core
            assert want is None, (pp, count, g)
        n += want is not None
    assert 300 < n < 1900  # both verdicts and passes are exercised
    assert ms.interleaved_schedule_checks(3, 4, None, None) == []  # 1F1B without VPP checks nothing


# -- verl 0.9.1 micro-batching with VPP (in-process) -------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine_mb():
    sb = pytest.importorskip("verl.utils.seqlen_balancing", reason="verl 0.9.1 (test oracle) is not installed")
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    base = Path(sb.__file__).resolve().parents[1]
    src = (base / "workers" / "engine" / "utils.py").read_text()
    fn = next(n for n in ast.parse(src).body if getattr(n, "name", "") == "prepare_micro_batches")
    ns = {"tu": tu, "torch": torch, "rearrange_micro_batches": sb.rearrange_micro_batches}
    exec(compile(ast.Module([fn], []), "verl/workers/engine/utils.py", "exec"), ns)  # noqa: S102
    impl = (base / "workers" / "engine" / "megatron" / "transformer_impl.py").read_text()
    fbb = next(n for n in ast.walk(ast.parse(impl)) if getattr(n, "name", "") == "forward_backward_batch")
    vpp_if = [
        n for n in fbb.body if isinstance(n, ast.If) and ast.unparse(n.test) == "num_batches_divided_by is not None"
    ]
    assert len(vpp_if) == 1 and isinstance(vpp_if[0].body[0], ast.Assert)
    return SimpleNamespace(
        prepare=ns["prepare_micro_batches"], tu=tu, torch=torch, TD=TensorDict, vpp=compile(ast.Module(vpp_if, []),
        "transformer_impl.py", "exec"),
    )  # fmt: skip


def test_engine_micro_batches_with_vpp_match_verl(engine_mb):
    from labkit.balance.micro_batches import rearrange_micro_batches

    rng = random.Random(91)
    m, seen = engine_mb, set()
    for i in range(N_STEP):
        rows, pp, vpp, g = rng.randint(1, 48), _pick(rng, 2, 4), _pick(rng, None, 2, 3), _pick(rng, None, 1, 2, 3, 4)
        cp, dyn = _pick(rng, 1, 2), i % 2 == 1
        div = ms.num_batches_divided_by(pp, vpp, g)
        lens = [rng.randint(1, 300) for _ in range(rows)]
        ids = m.torch.nested.as_nested_tensor(
            [m.torch.zeros(n, dtype=m.torch.long) for n in lens], layout=m.torch.jagged
        )
        data = m.TD({"input_ids": ids}, batch_size=[rows])
        budget, micro = _pick(rng, 300, 450, 1000), _pick(rng, 1, 2, 3, 4, 8)
        m.tu.assign_non_tensor(data, use_dynamic_bsz=dyn, sp_size=cp, micro_batch_size_per_gpu=micro)
        if dyn:
            m.tu.assign_non_tensor(data, max_token_len_per_gpu=budget)
        ns = {}
        try:
            mbs, _ = m.prepare(data, num_batches_divided_by=div)
            ns = {"micro_batches": mbs, "num_batches_divided_by": div}
            exec(m.vpp, ns)  # noqa: S102 - verl's own assert
            want = (len(mbs), None)
        except AssertionError as e:
            want = (len(ns["micro_batches"]) if ns else None, str(e))
        except ValueError as e:  # the dynamic E35 (count past the rows)
            want = (None, str(e))
        if dyn:
            try:
                plan = rearrange_micro_batches(lens, budget * cp, profile="engine", num_batches_divided_by=div)
                got = (plan.num_micro_batches, None)
            except (AssertionError, ValueError) as e:
                got = (None, str(e))
        elif rows % micro:
            got = (None, "data size must be divisible by force_group_size * micro_batch_size_per_gpu")
        else:
            count = ms.static_micro_batches(rows, micro)
            v = ms.vpp_micro_batch_check(count, div)
            got = (count, v.message if v.fired else None)
        if got[1] and want[1] and got[1].startswith("micro_batches"):  # verl prints the TensorDicts themselves
            assert code_of(want[1], ("M21",)) == "M21" and got[0] == want[0], (got, want)
            assert message_fields("M21", want[1])["group"] == message_fields("M21", got[1])["group"]
        else:
            assert got == want, (rows, micro, dyn, div, got, want)
        seen.add((dyn, want[1] is None))
        if dyn and want[1] and want[1].startswith("max_token_len must be"):  # E31 with the budget x CP
            assert f"max_token_len={budget * cp}" in want[1]
        if dyn and want[1] is None:  # a dynamic count is always a whole number of groups of G under VPP > 1
            assert div is None or want[0] % div == 0
    assert seen == {(True, True), (True, False), (False, True), (False, False)}


def test_dynamic_cp_refused_by_megatron_core_0161(mcore):
    pytest.importorskip("verl.utils.dynamic_cp_scheduler", reason="verl 0.9.1 (test oracle) is not installed")
    from verl.utils.dynamic_cp_scheduler import get_megatron_dynamic_cp_scheduler_cls

    with pytest.raises(RuntimeError) as exc:
        get_megatron_dynamic_cp_scheduler_cls()
    assert [v.message for v in mr.dynamic_cp_checks(True, True, None) if v.fired] == [str(exc.value)]
    assert (
        "dynamic_context_parallel" not in __import__("inspect").signature(mcore.ps.initialize_model_parallel).parameters
    )


# -- verl 0.7.1 megatron_workers.py normalisation (compiled from its source) -------------------------------------------
def _legacy_blocks() -> tuple:
    src = (ORACLE_071 / "verl" / "workers" / "megatron_workers.py").read_text()
    classes = {n.name: n for n in ast.parse(src).body if isinstance(n, ast.ClassDef)}

    def init_of(name: str) -> list:
        return next(n for n in classes[name].body if getattr(n, "name", "") == "__init__").body

    actor = [n for n in init_of("ActorRolloutRefWorker") if isinstance(n, ast.If) and ast.unparse(n.test) ==
             "self._is_actor" and "ppo_mini_batch_size *=" in ast.unparse(n)]  # fmt: skip
    critic = [n for n in init_of("CriticWorker") if isinstance(n, ast.AugAssign | ast.If) and "ppo_m" in ast.unparse(n)]
    assert len(actor) == 1 and len(critic) == 3
    return compile(ast.Module(actor, []), "megatron_workers.py", "exec"), compile(
        ast.Module(critic, []), "megatron_workers.py", "exec"
    )


def test_legacy_worker_normalisation_matches_verl_071():
    if not (ORACLE_071 / "verl").is_dir():
        pytest.skip("verl 0.7.1 oracle absent")
    from omegaconf import OmegaConf

    actor_code, critic_code = _legacy_blocks()
    yaml_tree = OmegaConf.load(ORACLE_071 / "verl" / "trainer" / "config" / "_generated_ppo_megatron_trainer.yaml")
    read = [f"{sec}.{k}" for sec, keys in (
        (A, ("ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu")),
        (RO, ("n", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu")),
        (MG, ("param_offload", "grad_offload", "optimizer_offload")),
    ) for k in keys]  # fmt: skip
    base: dict = {}
    for k in read:  # the 0.7.1 YAML's own defaults (KeyError if the block's keys moved)
        node = base
        *parents, leaf = k.split(".")[1:]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = OmegaConf.select(yaml_tree, k, throw_on_missing=True)
    rng, seen = random.Random(71), set()
    for i in range(400):
        cfg = megatron_config(rng, "legacy")
        if i % 3 == 0:
            cfg.set(f"{A}.use_dynamic_bsz", True)
            cfg.set(f"{A}.ppo_micro_batch_size", _pick(rng, 4, 8, 16))
            if rng.random() < 0.5:
                cfg.set(f"{RO}.log_prob_micro_batch_size", 8)
        if i % 5 == 0:
            cfg.set("critic.ppo_micro_batch_size", _pick(rng, 4, 16))
            cfg.set("critic.ppo_micro_batch_size_per_gpu", None)
        s = Snap(cfg)
        D = s.geo.parallel.dp_size
        if not D:
            continue
        root = OmegaConf.create({"actor_rollout_ref": base})  # 0.7.1's defaults for what the block reads
        for k, v in cfg.values.items():
            if k in read:
                OmegaConf.update(root, k, v)
        mpu = SimpleNamespace(get_data_parallel_world_size=lambda D=D: D)
        worker = SimpleNamespace(config=root.actor_rollout_ref, _is_actor=True, _is_ref=True)
        ns = {"self": worker, "mpu": mpu}
        try:
            exec(actor_code, ns)  # noqa: S102 - verl 0.7.1's own normalisation
            want = (worker.config.actor.ppo_mini_batch_size, worker.config.actor.ppo_micro_batch_size_per_gpu,
                    worker.config.rollout.log_prob_micro_batch_size_per_gpu, None)  # fmt: skip
        except TypeError as e:
            want = (None, None, None, str(e))
        run = Run()
        norm = legacy_init(run, s)
        x8 = next((f for f in run.checks if f.code == "X8" and f.severity == "error"), None)
        if not norm and not x8:  # megatron-core's expert layout failed first (M9): nothing is normalised
            assert [f.code for f in run.checks if f.severity == "error"] in (["M8"], ["M9"])
            continue
        got = (None, None, None, x8.message) if x8 else (norm["Mp"], norm["actor"], norm["rollout"], None)
        assert got == want, (sorted(cfg.values.items()), got, want)
        assert x8 is not None or normalized_mini(cfg) == want[0]
        seen.add(want[3] is not None)
        if not x8 and s.need_critic:
            critic = OmegaConf.create({"ppo_mini_batch_size": s.critic_ppo_mini_batch_size, "rollout_n": s.rollout_n,
                                       "ppo_micro_batch_size": s.critic_ppo_micro_batch_size,
                                       "ppo_micro_batch_size_per_gpu": s.critic_ppo_micro_batch_size_per_gpu})  # fmt: skip
            ns = {"self": SimpleNamespace(config=critic), "mpu": mpu}
            exec(critic_code, ns)  # noqa: S102
            assert (norm["Mcp"], norm["critic"]) == (critic.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu)
    assert seen == {True, False}


# -- end to end and bad input ------------------------------------------------------------------------------------------
def test_check_reports_megatron_checks_in_order():
    cfg = VerlConfig(profile="engine").override([
        "model_engine=megatron", "trainer.n_gpus_per_node=8", "data.train_batch_size=64", f"{RO}.n=4",
        f"{A}.ppo_mini_batch_size=32", f"{A}.ppo_micro_batch_size_per_gpu=3", f"{RO}.log_prob_micro_batch_size_per_gpu=8",
        f"{MG}.pipeline_model_parallel_size=4", f"{MG}.virtual_pipeline_model_parallel_size=2", "trainer.use_v1=false",
        f"{A}.use_dynamic_bsz=false", "critic.ppo_micro_batch_size_per_gpu=8",
    ])  # fmt: skip
    report = check(cfg, 28, 4, num_layers=32, vocab_size=151936, fixes=False)
    codes = [f.code for f in report.checks]
    assert codes.index("E2") < codes.index("E1") < codes.index("M3") < codes.index("M7") < codes.index("M17")
    assert codes.index("M17") < codes.index("M18") < codes.index("E30") < codes.index("M21") < codes.index("M22")
    assert report.first_error.code == "E1" and report.first_error.message.endswith("(6)")  # DP 2 x m 3
    e30 = [f for f in report.checks if f.code == "E30" and f._role == "actor"]
    assert e30 and e30[0].severity == "error"  # 64 rows per rank % 3
    later = check(cfg.copy().override([f"{A}.ppo_micro_batch_size_per_gpu=8"]), 28, 4, num_layers=28, fixes=False)
    assert (
        later.first_error.code == "M18"
        and "7             should be divisible by vp_size 2" in later.first_error.message
    )
    assert later.first_error.fixes == [] and check(cfg.copy().override([f"{A}.ppo_micro_batch_size_per_gpu=8"]), 28,
                                                   4, num_layers=28).first_error.fixes  # fmt: skip


@pytest.mark.parametrize(
    "args, code",
    [
        (["model_engine=megatron", f"{MG}.tensor_model_parallel_size=3"], 1),  # verl rejects it: E2
        (["model_engine=megatron", f"{MG}.tensor_model_parallel_size=0"], 2),
        (["model_engine=megatron", f"{MG}.pipeline_model_parallel_size=-2"], 2),
        (["model_engine=megatron", f"{MG}.tensor_model_parallel_size=abc"], 2),
        (["model_engine=megatron", f"{MG}.context_parallel_size=99999999999999999999"], 2),
        (["model_engine=megatron", f"{MG}.context_parallel_size=4096", "trainer.n_gpus_per_node=4096"], 1),
        (["model_engine=megatron", f"{MG}.tensor_paralel_size=2"], 2),
        (["model_engine=megatron", f"{MG}.virtual_pipeline_model_parallel_size=0"], 2),
    ],
)
def test_cli_bad_megatron_input(args, code):
    from labkit.cli import main

    out, err = __import__("io").StringIO(), __import__("io").StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["check", *args])
    assert rc == code, (rc, out.getvalue(), err.getvalue())
    assert "Traceback" not in out.getvalue() + err.getvalue()
    assert (out.getvalue() + err.getvalue()).strip()


def test_vpp_micro_batch_error_has_verified_fixes():
    """Static micro-batching under VPP: 24 rows per rank / m 8 = 3 micro-batches, not a multiple of G = PP = 2."""
    overrides = [
        "model_engine=megatron", "trainer.n_gpus_per_node=8", "data.train_batch_size=16", f"{RO}.n=3",
        f"{A}.ppo_mini_batch_size=16", f"{A}.ppo_micro_batch_size_per_gpu=8", f"{RO}.log_prob_micro_batch_size_per_gpu=4",
        f"{MG}.tensor_model_parallel_size=2", f"{MG}.pipeline_model_parallel_size=2",
        f"{MG}.virtual_pipeline_model_parallel_size=2", "algorithm.adv_estimator=grpo",
    ]  # fmt: skip
    cfg = VerlConfig(profile="engine").override(overrides)
    first = check(cfg).first_error
    assert (first.code, first._role, first.when) == ("M21", "actor", "step 1")
    assert (
        first.message
        == "micro_batches <3 micro-batches> must be divisible by num_batches_divided_by 2 for megatron backend"
    )
    assert first.fixes
    for fix in first.fixes:
        assert check(cfg.copy().override(fix.split()), fixes=False).ok, fix


@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_startup_matches_verl_validate_config(startup, profile):
    cfgs, answers = startup
    if profile not in answers:
        pytest.skip("verl 0.7.1 oracle absent")
    assert answers[profile]["version"] == ("0.9.1" if profile == "engine" else "0.7.1")
    bad, codes = [], {}
    for cfg, res in zip(cfgs[profile], answers[profile]["results"], strict=True):
        checks = check(cfg, fixes=False).checks
        first = next((f for f in checks if f.when == "start-up" and f.severity == "error"), None)
        got = [first.exc_type, first.message] if first else None
        sp_warn = sum(1 for line in res["stdout"] if line == "WARN set sequence parallel to false as TP size is 1")
        ours = sum(1 for f in checks if f.code == "M3" and f.severity == "notice")
        if got != res["error"] or (res["error"] is None and sp_warn != ours):
            bad.append((sorted(cfg.values.items()), got, res["error"], ours, sp_warn))
        codes[first.code if first else "pass"] = codes.get(first.code if first else "pass", 0) + 1
    assert not bad, f"{len(bad)} of {len(cfgs[profile])} disagree; first: {bad[:2]}"
    want = {"E2", "M1", "E1", "pass"} | ({"M2"} if profile == "engine" else set())
    assert want <= set(codes), codes  # the random configs reach every Megatron start-up verdict


def test_uneven_first_stage_is_checked_as_megatron_core_splits_the_rest():
    from labkit.config.verl_config import load_config
    from labkit.validate.report import check

    tc = "actor_rollout_ref.actor.megatron.override_transformer_config"
    base = ["model_engine=megatron", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=4"]
    base += ["actor_rollout_ref.actor.use_dynamic_bsz=true"]
    shape = {"num_attention_heads": 32, "num_key_value_heads": 8, "num_layers": 36, "num_experts": 0}
    bad = check(load_config(None, [*base, f"+{tc}.num_layers_in_first_pipeline_stage=7"]), fixes=False, **shape)
    assert bad.first_error is not None and bad.first_error.code == "M20"  # 29 layers left over 3 stages
    ok = check(load_config(None, [*base, f"+{tc}.num_layers_in_first_pipeline_stage=6"]), fixes=False, **shape)
    assert not [f for f in ok.findings if f.code in ("M17", "M20") and f.severity == "error"]
