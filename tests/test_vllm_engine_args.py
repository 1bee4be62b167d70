"""The rollout engine without starting it: verl's rollout keys -> vLLM's LLM(...) and SamplingParams
(labkit.plan.rollout_engine), the new keys' defaults against verl's own YAML (both versions), verl's rollout-vs-actor
metrics against verl's function, the engines' output layout, the rank-file sweep and ``labkit plan``'s engine table.
Pure arithmetic and files: no process, no vLLM import."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from labkit.config.verl_config import load_config
from labkit.plan import rollout_engine as re_
from labkit.protocol.data_proto import DataProto
from labkit.rl import engines, rollout_metrics, rollout_output
from labkit.runtime import rank_files

ROOT = Path(__file__).resolve().parent.parent
R = "actor_rollout_ref.rollout"
TINY = json.loads((ROOT / "data/tiny-qwen2/config.json").read_text())
MODEL = re_.EngineModel.from_config(TINY)
GIB = 2**30
NEW_KEYS = ("dtype", "enforce_eager", "max_model_len", "enable_chunked_prefill", "enable_prefix_caching",
            "logprobs_mode", "calculate_log_probs", "seed", "ignore_eos", "gpu_memory_utilization",
            "free_cache_engine", "max_num_seqs", "max_num_batched_tokens")  # fmt: skip


def cfg(*overrides: str, profile: str = "engine"):
    base = ["trainer.n_gpus_per_node=4", "data.max_prompt_length=24", "data.max_response_length=32"]
    return load_config(overrides=[*base, *overrides], profile=profile)


def cpu(ram_gib: float = 24, ranks: int = 4, cpus: tuple = (0, 1)) -> re_.Host:
    return re_.Host("cpu", int(ram_gib * GIB), cpus, ranks)


def test_tiny_model_dims_and_kv_bytes_per_token():
    assert MODEL.params == 1_854_720  # the shipped model's parameter count (tests/test_tiny_model.py)
    L, kv, hd = (
        TINY["num_hidden_layers"],
        TINY["num_key_value_heads"],
        TINY["hidden_size"] // TINY["num_attention_heads"],
    )
    for tp, dtype, b in ((1, "float32", 4), (2, "float32", 4), (2, "bfloat16", 2), (4, "bfloat16", 2)):
        assert re_.kv_bytes_per_token(MODEL, tp, dtype) == 2 * L * math.ceil(kv / tp) * hd * b


def test_engine_arguments_follow_the_rollout_keys():
    c = cfg(f"{R}.tensor_model_parallel_size=2", f"{R}.gpu_memory_utilization=0.3", f"{R}.max_num_seqs=64",
            f"{R}.max_num_batched_tokens=512", f"{R}.enforce_eager=true", f"{R}.dtype=float32",
            f"{R}.enable_prefix_caching=false", f"{R}.seed=7")  # fmt: skip
    p = re_.plan_engine(c, MODEL, cpu())
    assert (p.tp, p.replicas, p.max_model_len) == (2, 2, TINY["max_position_embeddings"])  # None -> the model's
    kw = [p.llm_kwargs("m", r) for r in range(p.replicas)]
    assert [k["seed"] for k in kw] == [7, 8]  # verl 0.9.1: seed = replica_rank + rollout.seed
    k = kw[0]
    assert k["distributed_executor_backend"] == "external_launcher" and k["tensor_parallel_size"] == 2
    assert (k["max_num_seqs"], k["max_num_batched_tokens"], k["enforce_eager"], k["dtype"]) == (
        64,
        512,
        True,
        "float32",
    )
    assert k["enable_prefix_caching"] is False and k["logprobs_mode"] == "processed_logprobs"
    assert k["gpu_memory_utilization"] == 0.3 and k["enable_sleep_mode"] is False  # no sleep mode on CPU
    per_token = re_.kv_bytes_per_token(MODEL, 2, "float32")
    assert k["kv_cache_memory_bytes"] == 64 * 128 * per_token  # max_num_seqs × max_model_len: below the RAM share
    assert p.kv_cache_tokens % re_.CPU_BLOCK_SIZE == 0
    assert p.kv_cache_tokens == 64 * 128 and p.kv_budget_tokens > p.kv_cache_tokens
    assert p.threads_bind == "0|1|0|1" and p.cpu_binding == (0, 1, 0, 1)


def test_kv_cache_is_the_ram_share_when_that_is_smaller():
    c = cfg(f"{R}.gpu_memory_utilization=0.5", f"{R}.dtype=float32")
    ram = 64 * 2**20  # 64 MiB of RAM for 4 ranks: 8 MiB each minus the weights
    p = re_.plan_engine(c, MODEL, re_.Host("cpu", ram, (0,), 4))
    per_token = re_.kv_bytes_per_token(MODEL, 2, "float32")
    budget = (int(0.5 * ram / 4) - math.ceil(MODEL.params / 2) * 4) // per_token
    assert p.kv_budget_tokens == budget and p.kv_cache_tokens <= budget < p.max_num_seqs * p.max_model_len
    assert p.kv_cache_bytes % (re_.CPU_BLOCK_SIZE * per_token) == 0  # whole blocks
    with pytest.raises(ValueError, match="holds 0 tokens per rank, less than one sequence"):
        re_.check_fits(re_.plan_engine(c, MODEL, re_.Host("cpu", 2**20, (0,), 4)))


def test_gpu_host_leaves_the_kv_cache_to_vllm_and_sleeps():
    p = re_.plan_engine(cfg(), MODEL, re_.Host("cuda", 80 * GIB, (0,), 4))
    assert p.kv_cache_bytes is None and "kv_cache_memory_bytes" not in p.llm_kwargs("m", 0)
    assert p.sleep_mode is True and p.cpu_binding == () and p.threads_bind == "nobind"
    assert (
        re_.plan_engine(cfg(f"{R}.free_cache_engine=false"), MODEL, re_.Host("cuda", GIB, (0,), 1)).sleep_mode is False
    )


def test_lengths_are_checked_as_verl_does():
    with pytest.raises(ValueError, match=r"^max_model_len \(200\) should be less than or equal to max_position"):
        re_.plan_engine(cfg(f"{R}.max_model_len=200"), MODEL, cpu())
    with pytest.raises(ValueError, match="prompt_length \\+ response_length = 24 \\+ 32 exceeds max_model_len 48"):
        re_.plan_engine(cfg(f"{R}.max_model_len=48"), MODEL, cpu())
    p = re_.plan_engine(cfg(f"{R}.enable_chunked_prefill=false", f"{R}.max_num_batched_tokens=16"), MODEL, cpu())
    assert p.max_num_batched_tokens == 128 and any("raised from 16" in n for n in p.notes)
    assert re_.max_tokens_for(10, 24, 32, 128) == 32
    assert re_.max_tokens_for(120, 24, 32, 128) == 1  # a prompt wider than prompt_length: verl clamps to 1
    assert re_.max_tokens_for(120, 120, 32, 128) == 8  # capped by the room left in max_model_len
    with pytest.raises(ValueError, match=r"Prompt length \(128\) leaves no room"):
        re_.max_tokens_for(128, 24, 32, 128)


def test_sampling_params_follow_verls_sampling_keys():
    greedy = re_.sampling_kwargs(False, 0.7, 5, 0.9, 16, True, seed=3)
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"], greedy["min_p"]) == (0.0, 1.0, -1, 0.0)
    assert "seed" not in greedy and greedy["logprobs"] == 0 and greedy["n"] == 1 and greedy["max_tokens"] == 16
    sample = re_.sampling_kwargs(True, 0.7, 5, 0.9, 16, False, seed=3, stop_token_ids=[0])
    assert (sample["temperature"], sample["top_p"], sample["top_k"], sample["seed"]) == (0.7, 0.9, 5, 3)
    assert sample["logprobs"] is None and sample["stop_token_ids"] == [0] and sample["detokenize"] is False
    with pytest.raises(ValueError, match="temperature must be > 0 when sampling"):
        re_.sampling_kwargs(True, 0.0, -1, 1.0, 16, True)


@pytest.mark.parametrize("profile", ["engine", "legacy"])
def test_new_rollout_keys_default_to_verls_yaml(profile):
    """The engine keys' defaults equal verl 0.9.1's (engine) and 0.7.1's (legacy) generated ppo_trainer.yaml; 0.7.1
    has no rollout.seed (its server reads config.get("seed", 0))."""
    omegaconf = pytest.importorskip("omegaconf")
    spec = __import__("importlib").util.find_spec("verl")
    path = (
        Path(spec.origin).parent / "trainer/config/_generated_ppo_trainer.yaml"
        if profile == "engine"
        else ROOT / ".oracle/verl-0.7.1/verl/trainer/config/_generated_ppo_trainer.yaml"
    )
    if spec is None or not path.exists():
        pytest.skip("verl's YAML is not installed here")
    yaml = omegaconf.OmegaConf.load(path)
    c = load_config(profile=profile)
    for key in NEW_KEYS:
        want = omegaconf.OmegaConf.select(yaml, f"{R}.{key}", default="absent")
        if want == "absent":
            assert (profile, key, c.get(f"{R}.{key}")) == ("legacy", "seed", 0)
            continue
        assert c.get(f"{R}.{key}") == want, (profile, key)
    assert c.get(f"{R}.name") == "vllm"


def test_rollout_probs_diff_equals_verls_calculate_debug_metrics():
    metrics = pytest.importorskip("verl.utils.debug.metrics", reason="verl 0.9.1 (test oracle) is not installed")
    from verl import DataProto as VerlProto

    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        rows, width = 6, 9
        old = -torch.rand(rows, width, generator=g) * 3
        roll = old + torch.randn(rows, width, generator=g) * (0.01 * trial + 1e-4)
        mask = (torch.rand(rows, width, generator=g) > 0.3).long()
        tensors = {"old_log_probs": old, "rollout_log_probs": roll, "response_mask": mask,
                   "responses": torch.zeros(rows, width, dtype=torch.long)}  # fmt: skip
        ours = rollout_metrics.rollout_probs_diff(DataProto.from_dict(tensors=tensors))
        theirs = metrics.calculate_debug_metrics(VerlProto.from_dict(tensors=tensors))
        assert set(ours) == set(theirs) == set(rollout_metrics.NAMES)
        for k in ours:
            assert ours[k] == pytest.approx(theirs[k], rel=1e-6, abs=1e-9), k
    empty = DataProto.from_dict(tensors={**tensors, "response_mask": torch.zeros_like(mask)})
    assert rollout_metrics.rollout_probs_diff(empty)["training/rollout_probs_diff_valid"] == 0


def test_token_lists_become_verls_layout_with_log_probs():
    pad, eos, R_ = 0, 7, 5
    prompts = torch.tensor([[0, 11, 12], [13, 14, 15]])
    pmask = (prompts != 0).long()
    pos = (pmask.cumsum(1) - 1).clamp(min=0)
    toks, lps = [[21, eos, 22], [23, 24]], [[-0.5, -0.1, -2.0], [-0.3, -0.4]]  # row 1 stopped at its length cap
    out = rollout_output.from_token_lists(prompts, pmask, pos, toks, eos, pad, R_, lps)
    assert out["responses"].tolist() == [[21, eos, pad, pad, pad], [23, 24, pad, pad, pad]]
    assert out["response_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0]]
    want = torch.tensor([[-0.5, -0.1, 0, 0, 0], [-0.3, -0.4, 0, 0, 0]])
    assert torch.allclose(out["rollout_log_probs"], want)
    assert out["rollout_log_probs"].dtype == torch.float32
    assert torch.equal(out["attention_mask"], torch.cat([pmask, out["response_mask"]], 1))


def test_rank_files_sweep_removes_only_what_it_may(tmp_path, monkeypatch):
    folder = rank_files.new_group_dir()
    monkeypatch.setenv(rank_files.ENV, folder)
    shm = f"/dev/shm/labkit-test-{os.getpid()}-seg"
    outside = tmp_path / "not-mine.txt"
    for path in (shm, outside, os.path.join(folder, "sock")):
        Path(path).write_text("x")
    rank_files.register(f"/dev/shm/labkit-test-{os.getpid()}-*", str(outside), os.path.join(folder, "sock"))
    removed = rank_files.sweep(folder)
    assert sorted(removed) == sorted([shm, os.path.join(folder, "sock")])
    assert outside.exists() and not os.path.exists(shm) and not os.path.exists(folder)
    assert rank_files.sweep(str(tmp_path)) == [] and outside.exists()  # not a group folder: untouched


def test_vllm_falls_back_to_hf_with_one_notice(monkeypatch, capsys):
    monkeypatch.setattr(engines, "vllm_available", lambda: False)
    monkeypatch.setattr(engines, "_NOTICED", set())
    assert engines.resolve("vllm") == "hf" and engines.resolve("vllm") == "hf" and engines.resolve("hf") == "hf"
    err = capsys.readouterr().err
    assert err.count("vllm is not installed here; the rollout runs on the HF engine") == 1
    with pytest.raises(ValueError, match="must be one of"):
        engines.resolve("sglang")


def test_labkit_plan_says_what_each_engine_key_became(capsys):
    from labkit.cli import main

    argv = ["plan", "trainer.n_gpus_per_node=4", "data.max_prompt_length=24", "data.max_response_length=32",
            f"{R}.tensor_model_parallel_size=2", f"{R}.dtype=float32"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Rollout engine on this machine" in out and "2 engine(s) of TP 2, external_launcher" in out
    assert "tokens per rank (1,536 B/token)" in out and "no sleep mode on this platform" in out
    assert main([*argv, "--json"]) == 0
    engine = json.loads(capsys.readouterr().out)["summary"]["rollout_engine"]
    assert engine["kv_bytes_per_token"] == 1536 and engine["tp"] == 2 and engine["name"] == "vllm"
    assert np.isclose(engine["kv_cache_bytes"], engine["kv_cache_tokens"] * 1536)
