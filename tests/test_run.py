"""The resolved run (labkit.rules.run): one config read once per answer, its geometry and layout built once, and the
same answers whether a layer is handed the run or the config."""

from __future__ import annotations

import io
import sys
from collections import Counter
from contextlib import redirect_stdout

import pytest
from _known_configs import GRPO_7B_8K

from labkit.config.verl_config import VerlConfig, load_config
from labkit.memory.choice import settings_for
from labkit.memory.verdict import memory_report
from labkit.plan.step import plan
from labkit.rules import geometry, parallel_layout
from labkit.rules.run import Run, as_run
from labkit.validate.report import check

FITS = [
    "data.train_batch_size=64",
    "actor_rollout_ref.rollout.n=4",
    "trainer.n_gpus_per_node=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
]
MEGATRON = [
    "data.train_batch_size=64",
    "actor_rollout_ref.rollout.n=4",
    "trainer.n_gpus_per_node=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.strategy=megatron",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct",
]


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts each build of a geometry, an actor layout and a run while the test runs."""
    counts: Counter = Counter()
    geo, layout, reading = (
        geometry.BatchGeometry.from_config.__func__,
        parallel_layout.ParallelLayout.from_config.__func__,
        Run.reading.__func__,
    )

    def counted(name, original):
        def build(cls, *args, **kwargs):
            role = kwargs.get("role", args[1] if len(args) > 1 else "actor") if name == "layout" else None
            counts[name if role in (None, "actor") else f"layout:{role}"] += 1
            return original(cls, *args, **kwargs)

        return classmethod(build)

    monkeypatch.setattr(geometry.BatchGeometry, "from_config", counted("geometry", geo))
    monkeypatch.setattr(parallel_layout.ParallelLayout, "from_config", counted("layout", layout))
    monkeypatch.setattr(Run, "reading", counted("run", reading))
    return counts


def test_a_resolved_run_is_its_own_copy_and_as_run_reads_in_place() -> None:
    cfg = load_config(overrides=FITS)
    run = Run.resolve(cfg)
    cfg.override(["data.train_batch_size=128"])  # the caller's config changes afterwards: the run does not
    assert run.geometry.train_batch_size == 64 and run.get("data.train_batch_size") == 64
    assert as_run(run) is run
    with cfg.recording() as reads:  # a call's own run reads the caller's config: its reads are the caller's
        borrowed = as_run(cfg)
        borrowed.get("actor_rollout_ref.rollout.temperature")
    assert borrowed.config is cfg and borrowed.geometry.train_batch_size == 128
    assert {"data.train_batch_size", "actor_rollout_ref.rollout.temperature"} <= reads
    later = run.at_step(3)
    assert later is not run and later.geometry.global_step == 3 and later.config is run.config
    changed = run.with_values(**{"actor_rollout_ref.rollout.n": 8})
    assert changed.geometry.samples == 2 * run.geometry.samples and run.geometry.rollout_n == 4


@pytest.mark.parametrize("overrides", [FITS, MEGATRON], ids=["fsdp", "megatron"])
def test_one_answer_builds_the_geometry_and_layout_once(builds: Counter, overrides: list[str]) -> None:
    cfg = load_config(overrides=overrides)
    run = as_run(cfg)
    s = settings_for(run, None, "H100-80GB")
    rep = memory_report(run, s)
    assert rep.first_oom is None and rep.fixes == []  # a step that fits: no other run is priced
    assert builds["geometry"] == 1 and builds["layout"] == 1 and builds["run"] == 1, builds
    check(run, fixes=False)
    assert builds["geometry"] == 1 and builds["layout"] == 1, "check asked the run, not the config"
    plan(run)  # its validation searches fixes: each fix is another run, resolved once
    assert builds["geometry"] == builds["layout"] == builds["run"], builds


def test_every_fix_is_one_run_built_once(builds: Counter) -> None:
    cfg = load_config(overrides=[*GRPO_7B_8K, "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct"])
    rep = memory_report(cfg, settings_for(cfg, None, "H100-80GB"))
    assert rep.first_oom is not None and rep.fixes  # the fix search priced other configs
    assert builds["run"] > 1
    assert builds["geometry"] == builds["run"] and builds["layout"] == builds["run"], builds


@pytest.mark.parametrize("overrides", [FITS, GRPO_7B_8K, MEGATRON], ids=["fits", "ooms", "megatron"])
def test_the_run_and_the_config_give_the_same_answers(overrides: list[str]) -> None:
    cfg = load_config(overrides=overrides)
    run = as_run(cfg)
    s = settings_for(cfg, None, "H100-80GB")
    assert memory_report(run, s).to_dict() == memory_report(cfg, s).to_dict()
    assert [(f.code, f.message, f.fixes) for f in check(run).findings] == [
        (f.code, f.message, f.fixes) for f in check(cfg).findings
    ]
    assert plan(run, "gsm8k-like").to_dict() == plan(cfg, "gsm8k-like").to_dict()


def test_the_config_reaches_at_most_15_modules_in_one_memory_answer() -> None:
    """Following the config (or its run) through one ``labkit memory`` answer: the modules whose functions are
    handed it, besides the modules of its own classes (the config's and the run's methods)."""
    from labkit.cli import main

    args = ["memory", *FITS, "--gpu", "H100-80GB"]
    with redirect_stdout(io.StringIO()):
        main(args)  # warm: caches and lazy imports
    modules: Counter = Counter()

    def profile(frame, event, _arg):
        if event != "call" or not frame.f_globals.get("__name__", "").startswith("labkit."):
            return
        code = frame.f_code
        for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
            if isinstance(frame.f_locals.get(name), VerlConfig | Run):
                modules[frame.f_globals["__name__"]] += 1
                return

    with redirect_stdout(io.StringIO()):
        sys.setprofile(profile)
        try:
            main(args)
        finally:
            sys.setprofile(None)
    own = {cls.__module__ for cls in (*VerlConfig.__mro__, Run)}  # the config's and the run's own methods
    entered = set(modules) - own
    assert len(entered) <= 15, f"{len(entered)}: {sorted(entered)}"
