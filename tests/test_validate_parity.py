"""Parity: labkit's first start-up error == what verl's own ``validate_config`` raises, on hundreds of configs.

verl runs in subprocesses (one per version, in parallel) so ``import verl`` resolves to 0.9.1 (engine profile,
the venv) or 0.7.1 (legacy profile, ``.oracle/verl-0.7.1``). Each subprocess loads verl's
``_generated_ppo_trainer.yaml`` once, applies each config's explicit values with ``OmegaConf.update``
(interpolations stay live, so e.g. the critic micro-size quirk E14 is exercised), calls
``validate_config(config, use_reference_policy, use_critic)`` and reports the exception type and message.

Stubs, for speed and because verl is installed with --no-deps: ``ray``, ``peft``, ``accelerate`` and ``datasets``
import as empty modules (nothing compared here calls them),
``hydra.utils.instantiate`` (resolves the config, then calls each ``_target_`` dataclass like hydra does), and
``HFModelConfig`` (it would load a model from disk; no batch check reads it).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.config.keys import KEYS
from labkit.config.verl_config import SEED_EXAMPLE, VerlConfig, load_config
from labkit.validate.report import check

ROOT = Path(__file__).resolve().parent.parent
ORACLE_071 = ROOT / ".oracle" / "verl-0.7.1"
N_CONFIGS = 320

RUNNER = r'''
import contextlib, copy, functools, importlib, importlib.abc, importlib.machinery, importlib.util, io, json, os
import sys, types, warnings

class _Dummy:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and not k and callable(a[0]) else _Dummy()
    def __getattr__(self, name): return _Dummy()
    def __mro_entries__(self, bases): return (object,)
    def __iter__(self): return iter(())
    def __bool__(self): return False

class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"): raise AttributeError(name)
        return _Dummy()

class _ImportStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = _StubModule(spec.name); m.__path__ = []; return m
    def exec_module(self, module): pass

STUBS = {"ray", "peft", "accelerate", "datasets"}  # ray: slow to import; the rest: absent (--no-deps)
sys.meta_path.insert(0, _ImportStub())
from omegaconf import DictConfig, OmegaConf
import omegaconf._utils, omegaconf.base, omegaconf.grammar_parser
_parse = functools.lru_cache(maxsize=None)(omegaconf.grammar_parser.parse)  # read-only parse trees: speed only
omegaconf.base.parse = omegaconf._utils.parse = _parse

def instantiate(config, _convert_="partial", **kw):
    def build(node):
        if isinstance(node, dict):
            if "_target_" in node:
                kwargs = {k: build(v) for k, v in node.items() if k != "_target_"}
                if node["_target_"].endswith(".HFModelConfig"):
                    return kwargs
                mod, _, name = node["_target_"].rpartition(".")
                return getattr(importlib.import_module(mod), name)(**kwargs)
            return {k: build(v) for k, v in node.items()}
        if isinstance(node, list):
            return [build(x) for x in node]
        return node
    return build(OmegaConf.to_container(config, resolve=True))

hydra = types.ModuleType("hydra"); hydra_utils = types.ModuleType("hydra.utils"); hydra_utils.instantiate = instantiate
hydra.utils = hydra_utils; sys.modules["hydra"] = hydra; sys.modules["hydra.utils"] = hydra_utils
spec = importlib.util.find_spec("verl")
pkg = types.ModuleType("verl"); pkg.__path__ = [os.path.dirname(spec.origin)]; pkg.__file__ = spec.origin
sys.modules["verl"] = pkg  # skip verl/__init__ (it imports the whole trainer stack)
from verl.utils.config import validate_config
import verl.workers.config.critic as critic_mod
if hasattr(critic_mod, "HFModelConfig"):
    critic_mod.HFModelConfig = lambda **kw: kw
version = open(os.path.join(pkg.__path__[0], "version", "version")).read().strip()
base = OmegaConf.load(os.path.join(pkg.__path__[0], "trainer", "config", "_generated_ppo_trainer.yaml"))
KEEP = {"policy_loss", "val_kwargs", "agent", "model", "actor", "ref", "rollout"}

def prune(node):  # drop nested blocks validate_config never reads (profiler, optim, fsdp_config, ...)
    if not isinstance(node, dict):
        return node
    return {k: prune(v) for k, v in node.items() if not isinstance(v, dict) or k in KEEP}

tree = OmegaConf.to_container(base, resolve=False)
tree = {k: prune(tree[k]) for k in ("data", "trainer", "algorithm", "actor_rollout_ref", "critic")}
conf = OmegaConf.create(copy.deepcopy(tree))
_ABSENT = object()

def raw(path):
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node

def run_prim(name, a):
    """Run one of verl's step-1 primitives with the given sizes (its assert is what we compare)."""
    import torch
    from tensordict import TensorDict
    def td(rows):
        return TensorDict({"x": torch.zeros(rows, 1)}, batch_size=[rows])
    if name == "dp_chunk":
        from verl.protocol import DataProto
        DataProto.from_dict({"x": torch.zeros(a[0], 1)}).chunk(a[1])
    elif name == "kk":
        from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions
        workloads = calculate_workload(torch.arange(1, a[0] + 1))
        get_seqlen_balanced_partitions(workloads, k_partitions=a[1], equal_size=True)
    elif name == "td_chunk":
        from verl.utils.tensordict_utils import chunk_tensordict
        chunk_tensordict(td(a[0]), a[1])
    elif name == "iter":
        from verl.utils.tensordict_utils import make_iterator
        next(iter(make_iterator(td(a[0]), a[1], 1, seed=0, dataloader_kwargs={})))
    elif name == "prepare_static":  # the function alone: its module imports PIL, datasets, ... (absent)
        import ast
        from verl.utils import seqlen_balancing, tensordict_utils as tu
        src = open(os.path.join(pkg.__path__[0], "workers", "engine", "utils.py")).read()
        fn = next(n for n in ast.parse(src).body if getattr(n, "name", "") == "prepare_micro_batches")
        ns = {"tu": tu, "torch": torch, "TensorDict": TensorDict,
              "rearrange_micro_batches": seqlen_balancing.rearrange_micro_batches}
        exec(compile(ast.Module([fn], []), "verl/workers/engine/utils.py", "exec"), ns)
        prepare_micro_batches = ns["prepare_micro_batches"]
        data = td(a[0])
        tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=a[1])
        prepare_micro_batches(data)
    elif name == "rearrange_padded":
        from verl.utils.seqlen_balancing import rearrange_micro_batches
        rows, width, budget = a
        rearrange_micro_batches(TensorDict({"input_ids": torch.zeros(rows, width, dtype=torch.long),
                                            "attention_mask": torch.ones(rows, width, dtype=torch.long)},
                                           batch_size=[rows]), max_token_len=budget)
    elif name == "rearrange_nested":
        from verl.utils.seqlen_balancing import rearrange_micro_batches
        rows, longest, budget = a
        ids = torch.nested.nested_tensor([torch.zeros(longest if i == 0 else 3, dtype=torch.long)
                                          for i in range(rows)], layout=torch.jagged)
        rearrange_micro_batches(TensorDict({"input_ids": ids}, batch_size=[rows]), max_token_len=budget)
    else:
        raise KeyError(name)


warnings.simplefilter("ignore")
out = []
for job in json.load(sys.stdin):
    if "prim" in job:
        try:
            run_prim(job["prim"][0], job["prim"][1:])
            out.append({"error": None, "stdout": []})
        except Exception as e:
            out.append({"error": [type(e).__name__, str(e)], "stdout": []})
        continue
    saved = {k: raw(k) for k in job["values"]}
    for k, v in job["values"].items():
        OmegaConf.update(conf, k, v, force_add=True)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            validate_config(conf, job["ref"], job["critic"])
        err = None
    except Exception as e:
        err = [type(e).__name__, str(e)]
    out.append({"error": err, "stdout": buf.getvalue().splitlines()})
    for k, v in saved.items():  # restore the shared config (cheaper than a copy per job)
        if v is _ABSENT:
            parent, _, leaf = k.rpartition(".")
            del OmegaConf.select(conf, parent)[leaf]
        else:
            OmegaConf.update(conf, k, v, force_add=True)
json.dump({"version": version, "results": out}, sys.stdout)
'''

ARR, ACT, RO, REF = "actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"


def random_config(rng: random.Random, profile: str) -> VerlConfig:
    """A random batching config: sizes, deprecated keys, dynamic, SP, ref/critic roles, loss modes, val sampling."""
    cfg = VerlConfig(profile=profile)
    pick = rng.choice
    gpn, nnodes = pick([1, 2, 3, 4, 6, 8, 8]), pick([1, 1, 1, 2, 3])
    W = gpn * nnodes
    n = pick([1, 2, 3, 4, 5, 8, 12, 13, 16])
    B = pick([rng.randint(1, 96), W * rng.randint(1, 12), 60, 64, 7])
    v = {
        "trainer.n_gpus_per_node": gpn,
        "trainer.nnodes": nnodes,
        "data.train_batch_size": B,
        f"{RO}.n": n,
        f"{RO}.name": "hf",
    }
    if rng.random() < 0.8:
        v[f"{ACT}.ppo_mini_batch_size"] = pick([B, max(1, B // 2), max(1, B // 4), rng.randint(1, B + 8)])
    if rng.random() < 0.75:
        v[f"{ACT}.ppo_micro_batch_size_per_gpu"] = pick([1, 2, 4, 5, 8, 10, 16])
    if rng.random() < 0.2:
        v[f"{ACT}.ppo_micro_batch_size"] = pick([1, 4, 8, W, 2 * W, 30, 64])
    if rng.random() < 0.2:
        v[f"{ACT}.use_dynamic_bsz"] = True
    sp = pick([1, 1, 2, 4])
    if sp > 1 or rng.random() < 0.2:
        v[f"{ACT}.ulysses_sequence_parallel_size"] = sp
    if rng.random() < 0.3:
        v[f"{ARR}.model.use_remove_padding"] = rng.random() < 0.5
    v[f"{ACT}.use_kl_loss"] = rng.random() < 0.4
    v["algorithm.use_kl_in_reward"] = rng.random() < 0.15
    v["algorithm.adv_estimator"] = pick(["grpo", "gae", "grpo"])
    if rng.random() < 0.2:
        v["critic.enable"] = pick([True, False])
    for sec in (RO, REF):
        r = rng.random()
        if r < 0.65:
            v[f"{sec}.log_prob_micro_batch_size_per_gpu"] = pick([1, 4, 8, 16])
        elif r < 0.8:
            v[f"{sec}.log_prob_micro_batch_size"] = pick([4, 8, 32])
        elif r < 0.9:
            v[f"{sec}.log_prob_micro_batch_size_per_gpu"] = 8
            v[f"{sec}.log_prob_micro_batch_size"] = 8
    r = rng.random()
    if r < 0.5:
        v["critic.ppo_micro_batch_size_per_gpu"] = pick([1, 2, 4, 8])
    elif r < 0.7:
        v["critic.ppo_micro_batch_size"] = pick([2, 4, 8, 12, 64])
        if rng.random() < 0.4:
            v["critic.ppo_micro_batch_size_per_gpu"] = None
    if rng.random() < 0.3:
        v["critic.ppo_mini_batch_size"] = pick([B, B + 4, max(1, B // 3)])
    if rng.random() < 0.15:
        v["critic.use_dynamic_bsz"] = pick([True, False])
    if rng.random() < 0.3:
        v["critic.ulysses_sequence_parallel_size"] = pick([1, 2, 4])
    # mostly explicit (0.9.1's YAML default is true, 0.7.1's false); the TARGETED list covers the default
    v["critic.model.use_remove_padding"] = rng.random() < 0.6
    if rng.random() < 0.2:
        v[f"{ACT}.loss_agg_mode"] = pick(["token-sum", "seq-mean-token-mean", "sample-mean", "seq-mean-token-sum-norm"])
    if rng.random() < 0.25:
        v[f"{RO}.val_kwargs.do_sample"] = True
        v[f"{RO}.temperature"] = pick([0.0, 0.7, 1.0])
    if rng.random() < 0.1:
        v["data.val_batch_size"] = 16
    if profile == "engine":  # the oracle here is verl's v0 loop (RayPPOTrainer); v1: tests/test_v1_oracle.py
        v["trainer.use_v1"] = False
    for k, val in v.items():
        if k == "actor_rollout_ref.actor.loss_agg_mode":
            cfg.values[k] = val  # labkit accepts any string here; verl checks it (E8)
        else:
            cfg.set(k, val)
    return cfg


SEED = [
    "data.train_batch_size=60",
    f"{RO}.n=12",
    "trainer.n_gpus_per_node=6",
    f"{ACT}.ppo_mini_batch_size=60",
    f"{ACT}.ppo_micro_batch_size_per_gpu=8",
    f"{RO}.log_prob_micro_batch_size_per_gpu=8",
    f"{REF}.log_prob_micro_batch_size_per_gpu=8",
    "algorithm.adv_estimator=gae",
    "critic.model.use_remove_padding=true",
]
TARGETED = [  # one config per rarer message, so every check is exercised whatever the random draw
    ["critic.ppo_micro_batch_size=4"],  # E14 (the quirk)
    ["critic.ppo_micro_batch_size_per_gpu=4", "critic.ppo_mini_batch_size=64"],  # E16
    ["critic.ppo_micro_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=null"],  # E17
    ["critic.ppo_micro_batch_size=7", "critic.ppo_micro_batch_size_per_gpu=null"],  # E15
    [
        "critic.ppo_micro_batch_size_per_gpu=4",
        "critic.ulysses_sequence_parallel_size=2",
        "critic.model.use_remove_padding=false",
    ],  # E18 (legacy only)
    [
        "critic.ppo_micro_batch_size_per_gpu=4",
        "critic.ulysses_sequence_parallel_size=2",
        "~critic.model.use_remove_padding",
    ],  # E18 via 0.7.1's default
    [f"~{ACT}.ppo_micro_batch_size_per_gpu", f"{ACT}.ppo_micro_batch_size=4"],  # E11
    [f"~{ACT}.ppo_micro_batch_size_per_gpu", f"{ACT}.ppo_micro_batch_size=7"],  # E10
    [
        "critic.ppo_micro_batch_size_per_gpu=4",
        f"{ACT}.use_kl_loss=true",
        "algorithm.use_kl_in_reward=true",
        "data.val_batch_size=8",
    ],  # N1 + N2, passes
    [f"{ACT}.use_dynamic_bsz=true", "data.train_batch_size=7", f"{ACT}.ppo_mini_batch_size=64"],  # dynamic skips
    ["algorithm.adv_estimator=grpo", f"{ACT}.use_kl_loss=true", f"~{REF}.log_prob_micro_batch_size_per_gpu"],  # E3
    [f"{RO}.log_prob_micro_batch_size=8"],  # E4
    [f"{ACT}.ppo_micro_batch_size=8"],  # E6
]


DYN1 = [f"{ACT}.use_dynamic_bsz=true", f"{RO}.n=1", f"{RO}.agent.num_workers=1", f"~{ACT}.ppo_micro_batch_size_per_gpu"]
# (profile, overrides on SEED_EXAMPLE (GRPO), check() kwargs, expected first-error code, verl primitive + sizes
# derived here from the config by hand: N = B x n, D = W // sp, rows = N // D, mini = M x n // D,
# width = prompt + response length)
STEP_CASES = [
    ("legacy", [f"{RO}.n=13", f"{ACT}.ppo_micro_batch_size_per_gpu=10"], {}, "E26", ("dp_chunk", 60 * 13, 8)),
    ("engine", [f"{RO}.n=13", f"{ACT}.ppo_micro_batch_size_per_gpu=10"], {}, "E26", ("dp_chunk", 60 * 13, 8)),
    ("legacy", DYN1 + ["data.train_batch_size=61"], {}, "E38", ("kk", 61, 6)),
    ("engine", DYN1 + ["data.train_batch_size=61"], {}, "E38", ("kk", 61, 6)),
    ("legacy", DYN1 + ["data.train_batch_size=2", f"{ACT}.ppo_mini_batch_size=6"], {}, "E36", ("kk", 2, 6)),
    ("legacy", DYN1 + ["data.train_batch_size=61", "trainer.balance_batch=false"], {}, "E26", ("dp_chunk", 61, 6)),
    ("engine", DYN1 + ["data.train_batch_size=61", "trainer.balance_batch=false"], {}, "E27", ("td_chunk", 61, 6)),
    (
        "engine",
        [f"{ACT}.ppo_mini_batch_size=25", f"{ACT}.ppo_micro_batch_size_per_gpu=10"],
        {},
        "E29",
        ("iter", 60 * 12 // 6, 25 * 12 // 6),
    ),
    ("engine", [f"{RO}.log_prob_micro_batch_size_per_gpu=7"], {}, "E30", ("prepare_static", 60 * 12 // 6, 7)),
    (
        "engine",
        [f"{ACT}.ppo_mini_batch_size=20", f"{ACT}.ppo_micro_batch_size_per_gpu=3"],
        {},
        "E30",
        ("prepare_static", 20 * 12 // 6, 3),
    ),
    (
        "legacy",
        [
            f"{ACT}.use_dynamic_bsz=true",
            f"{ACT}.ppo_max_token_len_per_gpu=1000",
            "data.max_prompt_length=512",
            "data.max_response_length=1024",
        ],
        {},
        "E31",
        ("rearrange_padded", 4, 512 + 1024, 1000),
    ),
    (
        "engine",
        [f"{ACT}.use_dynamic_bsz=true", f"{ACT}.ppo_max_token_len_per_gpu=1000"],
        {"max_seq_len": 1200},
        "E31",
        ("rearrange_nested", 4, 1200, 1000),
    ),
]


PASS_PRIMS = {  # controls: the same primitives with sizes that divide must not raise
    "engine": [
        ("dp_chunk", 720, 8),
        ("kk", 720, 6),
        ("td_chunk", 720, 6),
        ("iter", 120, 40),
        ("prepare_static", 120, 8),
        ("rearrange_nested", 4, 1000, 1000),
    ],
    "legacy": [("dp_chunk", 720, 6), ("kk", 6, 6), ("rearrange_padded", 4, 1536, 1536)],
}


def _configs(profile: str) -> list[VerlConfig]:
    rng = random.Random(20261130 + (profile == "legacy"))
    v0 = ["trainer.use_v1=false"] if profile == "engine" else []  # verl's v0 loop is the oracle here
    targeted = [load_config(overrides=SEED + t + v0, profile=profile) for t in TARGETED]
    return targeted + [random_config(rng, profile) for _ in range(N_CONFIGS)]


def _run_oracles(jobs: dict[str, list[dict]]) -> dict[str, dict]:
    """Start one oracle subprocess per profile (in parallel) and collect their JSON answers."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    procs = {}
    for profile, js in jobs.items():
        e = dict(env)
        if profile == "legacy":
            e["PYTHONPATH"] = str(ORACLE_071)
        p = subprocess.Popen(
            [sys.executable, "-c", RUNNER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=e,
            cwd=str(ROOT),
        )
        p.stdin.write(json.dumps(js))
        p.stdin.close()
        procs[profile] = p
    out = {}
    for profile, p in procs.items():
        stdout = p.stdout.read()
        stderr = p.stderr.read()
        assert p.wait(timeout=300) == 0, f"{profile} oracle failed:\n{stderr[-3000:]}"
        out[profile] = json.loads(stdout)
    return out


@pytest.fixture(scope="module")
def parity():
    pytest.importorskip("omegaconf")
    if __import__("importlib").util.find_spec("verl") is None:
        pytest.skip("verl 0.9.1 (test oracle) is not installed: pip install --no-deps verl==0.9.1")
    profiles = ["engine"] + (["legacy"] if (ORACLE_071 / "verl").is_dir() else [])
    cfgs = {p: _configs(p) for p in profiles}
    jobs = {
        p: [{"values": dict(c.values), "ref": c.need_reference_policy, "critic": c.need_critic} for c in cs]
        for p, cs in cfgs.items()
    }
    fixed = {p: _fixed_configs(cfgs[p]) for p in profiles}
    for p in profiles:
        jobs[p] += [{"prim": list(case[4])} for case in STEP_CASES if case[0] == p]
        jobs[p] += [{"prim": list(prim)} for prim in PASS_PRIMS[p]]
        jobs[p] += [
            {"values": dict(c.values), "ref": c.need_reference_policy, "critic": c.need_critic} for c, _, _ in fixed[p]
        ]
    t0 = time.time()
    answers = _run_oracles(jobs)
    for p in profiles:
        n_cfg, n_fix = len(cfgs[p]), len(fixed[p])
        results = answers[p]["results"]
        answers[p]["fixed"] = list(zip(fixed[p], results[len(results) - n_fix :]))
        answers[p]["steps"] = results[n_cfg : len(results) - n_fix]
        answers[p]["results"] = results[:n_cfg]
    return cfgs, answers, time.time() - t0


N_FIX_CONFIGS = 40


def _fixed_configs(cfgs: list[VerlConfig]) -> list[tuple[VerlConfig, str, str]]:
    """(fixed config, fix, finding code) for every fix labkit suggests on the first failing configs."""
    out = []
    for cfg in [c for c in cfgs if check(c, fixes=False).errors][:N_FIX_CONFIGS]:
        for f in check(cfg).findings:
            out += [(cfg.copy().override(fix.split()), fix, f.code) for fix in f.fixes]
    return out


def _labkit_startup(cfg: VerlConfig) -> tuple[list | None, list[str]]:
    """labkit's first start-up error [type, message] and the notices printed before it."""
    printed = []
    for f in check(cfg, fixes=False).checks:
        if f.when != "start-up" or f.severity == "pass":
            continue
        if f.severity == "error":
            return [f.exc_type, f.message], printed
        if f.code in ("N1", "N2"):
            printed.append(f.message)
    return None, printed


@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_first_startup_error_matches_verl(parity, profile):
    cfgs, answers, _ = parity
    if profile not in answers:
        pytest.skip(f"{ORACLE_071} is absent (make venv unpacks verl 0.7.1 there)")
    expect_version = "0.9.1" if profile == "engine" else "0.7.1"
    assert answers[profile]["version"] == expect_version
    results = answers[profile]["results"]
    assert len(results) == len(cfgs[profile]) >= 300
    mismatches, codes, printed_any = [], {}, set()
    for cfg, res in zip(cfgs[profile], results):
        got, printed = _labkit_startup(cfg)
        want = res["error"]
        verl_printed = [line for line in res["stdout"] if line.startswith(("NOTICE", "WARNING"))]
        if got != want or printed != verl_printed:
            mismatches.append((sorted(cfg.values.items()), got, want, printed, verl_printed))
        first = check(cfg, fixes=False).first_error
        code = first.code if first is not None and first.when == "start-up" else "pass"
        codes[code] = codes.get(code, 0) + 1
        printed_any.update(line.split(":")[0] for line in verl_printed)
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]}"
    # the configs must exercise passes and every start-up message (else the test proves little)
    want_codes = {
        "E1",
        "E3",
        "E4",
        "E6",
        "E7",
        "E8",
        "E9",
        "E10",
        "E11",
        "E12",
        "E13",
        "E14",
        "E15",
        "E16",
        "E17",
        "E19",
    } | ({"E18"} if profile == "legacy" else set())
    assert want_codes <= set(codes), (sorted(want_codes - set(codes)), codes)
    assert codes["pass"] >= 30, codes
    assert printed_any == {"NOTICE", "WARNING"}


@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_first_step1_error_matches_verl_primitive(parity, profile):
    """labkit's first error at step 1 == what verl's own primitive raises for the same sizes (type and text)."""
    cfgs, answers, _ = parity
    if profile not in answers:
        pytest.skip(f"{ORACLE_071} is absent")
    cases = [c for c in STEP_CASES if c[0] == profile]
    steps = answers[profile]["steps"]
    assert len(steps) == len(cases) + len(PASS_PRIMS[profile])
    assert all(answer["error"] is None for answer in steps[len(cases) :]), steps[len(cases) :]
    for (prof, overrides, kwargs, code, prim), verl_answer in zip(cases, steps):
        v0 = ["trainer.use_v1=false"] if prof == "engine" else []
        first = check(load_config(overrides=SEED_EXAMPLE + overrides + v0, profile=prof), fixes=False, **kwargs)
        first = first.first_error
        assert first is not None and (first.code, first.when) == (code, "step 1"), (overrides, first)
        assert [first.exc_type, first.message] == verl_answer["error"], (prim, first.message, verl_answer)


@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_suggested_fixes_pass_verls_own_validate_config(parity, profile):
    """A fix labkit suggests (verified only against labkit's model) must also pass verl's validate_config."""
    _, answers, _ = parity
    if profile not in answers:
        pytest.skip(f"{ORACLE_071} is absent")
    fixed = answers[profile]["fixed"]
    bad = [(fix, code, sorted(c.values.items()), res["error"]) for (c, fix, code), res in fixed if res["error"]]
    assert len(fixed) >= 50 and not bad, (len(fixed), bad[:3])


def test_parity_stays_fast(parity):
    """Both oracles (import + every config) finish in bounded time; the two verl imports dominate."""
    assert parity[2] < 240, f"oracle subprocesses took {parity[2]:.0f} s"


def test_oracle_defaults_match_labkit_for_checked_keys():
    """labkit's defaults for the keys validate_config reads agree with verl's YAML (both versions)."""
    omegaconf = pytest.importorskip("omegaconf")
    from labkit.validate.snapshot import _SNAP_KEYS

    spec = __import__("importlib").util.find_spec("verl")
    if spec is None:
        pytest.skip("verl not installed")
    yamls = {
        "engine": Path(spec.origin).parent / "trainer/config/_generated_ppo_trainer.yaml",
        "legacy": ORACLE_071 / "verl/trainer/config/_generated_ppo_trainer.yaml",
    }
    diffs = []
    for profile, path in yamls.items():
        if not path.exists():
            continue
        conf = omegaconf.OmegaConf.load(path)
        conf.actor_rollout_ref.rollout.name = "hf"
        cfg = load_config(profile=profile)
        for key in _SNAP_KEYS.values():
            if profile not in KEYS[key].profiles:  # e.g. use_legacy_worker_impl (legacy), use_v1 (engine)
                continue
            want = omegaconf.OmegaConf.select(conf, key, default=None)
            if cfg.get(key) != want:
                diffs.append((profile, key, cfg.get(key), want))
    assert not diffs, diffs
