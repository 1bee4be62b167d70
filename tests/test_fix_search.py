"""The memory fix search (labkit.memory.fix_search.fixes_for over labkit.memory.fix_knobs): a fix always changes the
config, and says what from and to; what it sets is what the new peak was computed with; a knob family is one
function in CANDIDATES."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from labkit.config.text_input import load_pasted_config
from labkit.config.verl_config import load_config
from labkit.memory import fix_candidates, fix_knobs
from labkit.memory.choice import settings_for
from labkit.memory.fix_search import fixes_for
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import step_phases
from labkit.memory.verdict import memory_report

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests/data/launch_scripts/verl-1dda039/examples/grpo_trainer/run_qwen3_30b_a3b_fsdp.sh"
A, R, RF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
SETTINGS_KEYS = {  # MemorySettings field -> the config key a settings-only fix names
    "fused_kernels": "actor_rollout_ref.model.use_fused_kernels",
    "entropy_compiled": f"{A}.fsdp_config.use_torch_compile",
    "entropy_chunking": f"{A}.entropy_from_logits_with_chunking",
    "gradient_checkpointing": "actor_rollout_ref.model.enable_gradient_checkpointing",
    "param_offload": f"{A}.fsdp_config.param_offload",
    "optimizer_offload": f"{A}.fsdp_config.optimizer_offload",
    "ref_param_offload": f"{RF}.fsdp_config.param_offload",
    "free_cache_engine": f"{R}.free_cache_engine",
    "gpu_memory_utilization": f"{R}.gpu_memory_utilization",
    "max_num_seqs": f"{R}.max_num_seqs",
}


def _now(cfg, s: MemorySettings, key: str):
    """A key's value now: the config's, or for a knob the settings price, the settings' field."""
    field = next((f for f, k in SETTINGS_KEYS.items() if k == key), None)
    return getattr(s, field) if field is not None and key not in cfg.values else cfg.get(key)


def _assert_every_fix_changes_something(cfg, s, rep) -> None:
    for f in rep.fixes:
        assert f["changes"], f
        assert f["set"] != f["from"], f
        for ch in f["changes"]:
            assert ch["from"] != ch["to"], f
            if ch["to"] is not None:  # "~key" drops a key (the deprecated twin of a per-GPU size)
                assert ch["from"] == _now(cfg, s, ch["key"]), (ch, f)
        # "set" lists exactly the changed keys, as overrides
        assert [p.split("=", 1)[0].lstrip("~+") for p in f["set"].split(", ")] == [c["key"] for c in f["changes"]]


def test_the_qwen3_moe_script_gets_no_fix_it_already_has():
    """verl's run_qwen3_30b_a3b_fsdp.sh sets actor.use_dynamic_bsz=True: no fix may offer it again, and the budget
    fix says what the budget is now and what it becomes."""
    cfg, _ = load_pasted_config(SCRIPT.read_text())
    s = settings_for(cfg)
    rep = memory_report(cfg, s)
    assert rep.first_oom is not None and rep.fixes
    _assert_every_fix_changes_something(cfg, s, rep)
    assert not any(f"{A}.use_dynamic_bsz" in f["set"] for f in rep.fixes), [f["set"] for f in rep.fixes]
    budget = next(f for f in rep.fixes if f["knob"] == f"{A}.ppo_max_token_len_per_gpu")
    assert budget["from"] == f"{A}.ppo_max_token_len_per_gpu={cfg.get(f'{A}.ppo_max_token_len_per_gpu')}"
    assert "=true +" not in budget["knob"]  # the flag is on: the knob is the budget alone


def _random_config(rng: random.Random) -> list[str]:
    micro = rng.choice([1, 2, 4, 8, 16])
    out = [
        "algorithm.adv_estimator=grpo",
        f"data.train_batch_size={rng.choice([64, 128, 256])}",
        f"{R}.n={rng.choice([4, 8])}",
        f"{A}.ppo_mini_batch_size=32",
        f"{A}.ppo_micro_batch_size_per_gpu={micro}",
        f"{R}.log_prob_micro_batch_size_per_gpu={micro * rng.choice([1, 2, 4])}",
        f"{RF}.log_prob_micro_batch_size_per_gpu={micro}",
        f"data.max_prompt_length={rng.choice([512, 1024, 2048])}",
        f"data.max_response_length={rng.choice([1024, 4096, 8192, 16384])}",
        f"{A}.fsdp_config.use_torch_compile={rng.choice(['true', 'false'])}",
        f"{A}.entropy_from_logits_with_chunking={rng.choice(['true', 'false'])}",
        f"{A}.fsdp_config.param_offload={rng.choice(['true', 'false'])}",
        f"{A}.fsdp_config.optimizer_offload={rng.choice(['true', 'false'])}",
        f"{A}.use_kl_loss={rng.choice(['true', 'false'])}",
        f"{R}.gpu_memory_utilization={rng.choice([0.5, 0.7, 0.9])}",
        f"{R}.tensor_model_parallel_size={rng.choice([1, 2, 4])}",
    ]
    if rng.random() < 0.5:
        budget = rng.choice([16384, 32768, 65536])
        out += [f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu={budget}"]
        out += [f"{R}.log_prob_use_dynamic_bsz=true", f"{R}.log_prob_max_token_len_per_gpu={budget}"]
        out += [f"{RF}.log_prob_use_dynamic_bsz=true", f"{RF}.log_prob_max_token_len_per_gpu={budget}"]
    return out


@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_no_fix_repeats_the_config_on_random_configs(profile):
    """Random sizes, flags and budgets on a small GPU: every fix offered changes a value, its "from" is the value
    now, and applying its "set" to the config moves the phase's peak to what the fix says."""
    rng = random.Random(7 if profile == "engine" else 8)
    seen = 0
    for _ in range(12):
        over = _random_config(rng)
        cfg = load_config(None, over, profile=profile)
        s = settings_for(cfg, rng.choice(["Qwen2.5-7B", "Qwen2.5-3B"]), "A100-40GB")
        rep = memory_report(cfg, s)
        _assert_every_fix_changes_something(cfg, s, rep)
        for f in rep.fixes:
            keys = [c for c in f["changes"] if c["key"] in cfg.values or c["key"] not in SETTINGS_KEYS.values()]
            if len(keys) != len(f["changes"]) or any(c["to"] is None for c in keys):
                continue  # a settings-only knob, or a dropped key: the config side is checked above
            moved = load_config(None, [*over, *f["set"].split(", ")], profile=profile)
            again = step_phases(moved, settings_for(moved, s.model.name, "A100-40GB"))
            assert again[f["phase"]].peak_bytes == f["new_peak_bytes"], f
            seen += 1
    assert seen >= 5, seen


def test_a_knob_family_is_one_function_in_the_candidate_list(monkeypatch):
    """A family appended to CANDIDATES is searched like the others; a try the config already holds is skipped, and a
    knob whose every try is a value the config has offers nothing."""
    cfg = load_config(None, ["algorithm.adv_estimator=grpo", f"{R}.log_prob_micro_batch_size_per_gpu=64"])
    s = settings_for(cfg, "Qwen2.5-7B", "A100-40GB")
    phase = "old_log_prob"
    base = step_phases(cfg, s)[phase].peak_bytes

    def family(c, st, ph):
        same = {f"{R}.log_prob_micro_batch_size_per_gpu": 64}
        return [
            fix_candidates.Candidate("no-op knob", [same], "nothing"),
            fix_candidates.Candidate("fewer rows", [same, {f"{R}.log_prob_micro_batch_size_per_gpu": 1}], "time"),
        ]

    monkeypatch.setattr(fix_knobs, "CANDIDATES", [family])
    fixes = fixes_for(cfg, s, phase, step_phases, None)
    assert [f["knob"] for f in fixes] == ["fewer rows"]
    assert fixes[0]["set"] == f"{R}.log_prob_micro_batch_size_per_gpu=1"
    assert fixes[0]["from"] == f"{R}.log_prob_micro_batch_size_per_gpu=64"
    assert fixes[0]["new_peak_bytes"] < base
