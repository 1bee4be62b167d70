"""The larger fixes and the way out (labkit.memory.fix_scale, fix_combine, way_out): a larger rollout TP, LoRA,
Megatron's CPU optimizer and more nodes are offered where they move a phase; when no single knob makes the whole
step fit, the cheapest set of them that does is named, and re-pricing that set says the same; when none does, the
answer names how many GPUs like these (or which larger GPU) would."""

from __future__ import annotations

import json
import re

import pytest

from labkit.cli import main
from labkit.config.verl_config import load_config
from labkit.memory.choice import settings_for
from labkit.memory.headroom import state
from labkit.memory.step_memory import step_phases
from labkit.memory.verdict import memory_report
from labkit.validate.report import check

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
SMALL = [  # one row per micro-batch: what is left to fix is the model states, not the batch
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    f"{A}.ppo_mini_batch_size=8",
    f"{A}.ppo_micro_batch_size_per_gpu=1",
    f"{R}.log_prob_micro_batch_size_per_gpu=1",
    f"{R}.tensor_model_parallel_size=1",
]
FOURTEEN_B = [*SMALL, "trainer.n_gpus_per_node=2"]  # Qwen2.5-14B on 2 A100-40GB: ~117 GiB of model states a GPU


def _fits_everywhere(overrides: list[str], model: str, gpu: str, profile: str = "engine") -> bool:
    cfg = load_config(None, overrides, profile=profile, lenient=True)
    s = settings_for(cfg, model, gpu)
    return all(state(s, p.peak_bytes, p.info.get("engine_error"))[0] == "fits" for p in step_phases(cfg, s).values())


def _overrides(fix_set: str) -> list[str]:
    """A fix's ``set`` as Hydra overrides (``+key=value`` adds a key into one of verl's open mappings)."""
    return fix_set.split(", ")


def test_the_cheapest_set_fits_when_priced_again_and_needs_each_of_its_knobs():
    """14B full fine-tune on 2×40 GB: no single knob fits the whole step; the set offered makes every phase fit when
    its overrides are priced from scratch, verl accepts it, and without any one of its fixes the step is short."""
    cfg = load_config(None, FOURTEEN_B)
    rep = memory_report(cfg, settings_for(cfg, "Qwen2.5-14B", "A100-40GB"))
    assert rep.fixes and not any(f["step_fits"] for f in rep.fixes)
    together = rep.combined_fix
    assert together is not None and rep.way_out is None and len(together["knobs"]) >= 2
    parts = _overrides(together["set"])
    assert _fits_everywhere([*FOURTEEN_B, *parts], "Qwen2.5-14B", "A100-40GB")
    assert together["verl_error"] is None and check(load_config(None, [*FOURTEEN_B, *parts])).first_error is None
    fixes = together["set"].split(", ")
    for i in range(len(fixes)):  # each fix may set several keys: drop one fix at a time
        rest = [p for j, fix in enumerate(fixes) if j != i for p in _overrides(fix)]
        assert not _fits_everywhere([*FOURTEEN_B, *rest], "Qwen2.5-14B", "A100-40GB"), fixes[i]


def test_a_hopeless_config_names_the_gpus_that_would_fit_it(capsys):
    """72B on one H100, rollout TP 1: nothing labkit prices fits on one GPU, alone or together; the answer names the
    GPU count and layout that fit, and pricing that layout says every phase fits."""
    args = ["memory", "--model", "Qwen2.5-72B", *SMALL, "trainer.n_gpus_per_node=1", "--json"]
    assert main(args) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["combined_fix"] is None and doc["way_out"], doc["way_out"]
    sizes = re.search(r"\(([^)]*)\)", doc["way_out"]).group(1).split(", ")
    assert re.match(r"[\d,]+ GPUs like these", doc["way_out"]) and any(x.startswith("trainer.nnodes=") for x in sizes)
    assert _fits_everywhere([*SMALL, "trainer.n_gpus_per_node=1", *sizes], "Qwen2.5-72B", "H100-80GB")
    assert main(args[:-1]) == 1
    assert "what would: " in capsys.readouterr().out


def test_megatron_way_out_sizes_its_own_layout_and_offers_the_cpu_optimizer():
    """Under Megatron the CPU optimizer is offered as verl's recipes set it (``+`` keys of override_optimizer_config)
    and moves the update when priced again; the way out sizes Megatron's TP and PP, and that layout fits."""
    over = [*FOURTEEN_B, "model_engine=megatron"]
    cfg = load_config(None, over)
    rep = memory_report(cfg, settings_for(cfg, "Qwen2.5-14B", "A100-40GB"))
    cpu = next(f for f in rep.fixes if f["phase"] == "update_actor" and "optimizer_cpu_offload" in f["knob"])
    assert (
        cpu["set"].startswith(f"+{A}.optim.override_optimizer_config.optimizer_cpu_offload=true")
        and " unset" in cpu["from"]
    )
    moved = load_config(None, [*over, *_overrides(cpu["set"])], lenient=True)
    again = step_phases(moved, settings_for(moved, "Qwen2.5-14B", "A100-40GB"))
    assert again["update_actor"].peak_bytes == cpu["new_peak_bytes"] < rep.phases["update_actor"].peak_bytes
    assert rep.way_out and "megatron.tensor_model_parallel_size=" in rep.way_out
    sizes = re.search(r"\(([^)]*)\)", rep.way_out).group(1).split(", ")
    assert _fits_everywhere([*over, *sizes], "Qwen2.5-14B", "A100-40GB")


@pytest.mark.parametrize("release", [None, "0.3"])
def test_lora_and_a_larger_rollout_tp_where_the_release_has_them(release):
    """Qwen2.5-7B on one H100: LoRA (rank 32) makes the step fit, priced again from its overrides; verl 0.3 had no
    LoRA and is not offered it. Qwen2.5-14B on 2×40 GB with rollout TP 1: TP 2 lowers generate, as priced again."""
    from labkit.config.versions import RELEASES

    over = [*SMALL, "trainer.n_gpus_per_node=1"]
    cfg = load_config(None, over, profile="legacy" if release else "engine")
    if release:
        cfg.release = RELEASES[release]
    rep = memory_report(cfg, settings_for(cfg, "Qwen2.5-7B", "H100-80GB"))
    lora = [f for f in rep.fixes if f["knob"] == "actor_rollout_ref.model.lora_rank"]
    if release:
        assert not lora
        return
    assert lora and all(f["step_fits"] and f["kind"] == "another run" for f in lora)
    assert _fits_everywhere([*over, lora[0]["set"]], "Qwen2.5-7B", "H100-80GB")
    cfg = load_config(None, FOURTEEN_B)
    rep = memory_report(cfg, settings_for(cfg, "Qwen2.5-14B", "A100-40GB"))
    tp = next(f for f in rep.fixes if f["knob"] == f"{R}.tensor_model_parallel_size")
    assert tp["phase"] == "generate" and tp["set"] == f"{R}.tensor_model_parallel_size=2"
    moved = load_config(None, [*FOURTEEN_B, tp["set"]])
    assert (
        step_phases(moved, settings_for(moved, "Qwen2.5-14B", "A100-40GB"))["generate"].peak_bytes
        == tp["new_peak_bytes"]
    )
