"""What the releases forks vendor did differently for memory, each on TinyZero's own launch script
(tests/data/fork_scripts) priced with ``--verl 0.3`` (or 0.1) and ``--verl 0.9.1``: one test per difference, its
docstring citing the code at each tag. And the forks' scripts are answered, their own keys named, never refused."""

from __future__ import annotations

import contextlib
import io
import json
from functools import cache
from pathlib import Path

from labkit.cli import main

FORKS = Path(__file__).parent / "data" / "fork_scripts"
TINYZERO = FORKS / "TinyZero-95df88f" / "scripts" / "train_tiny_zero.sh"
SEARCH_R1 = FORKS / "Search-R1-a14dc3a" / "train_ppo.sh"
README_EXPORTS = [  # what TinyZero's README exports before running the script (its 3B run on two GPUs)
    "--set", "BASE_MODEL=Qwen/Qwen2.5-3B", "--set", "N_GPUS=2", "--set", "ROLLOUT_TP_SIZE=2",
    "--set", "DATA_DIR=data/countdown", "--set", "EXPERIMENT_NAME=countdown-qwen2.5-3b",
]  # fmt: skip


def _run(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["memory", *args])
    return code, out.getvalue()


@cache
def tinyzero(version: str, *extra: str) -> dict:
    code, out = _run(str(TINYZERO), *README_EXPORTS, "--gpu", "A100-80GB", "--verl", version, *extra, "--json")
    assert code in (0, 1), out
    return json.loads(out)


def test_the_reference_runs_every_step_before_0_4():
    """0.1 to 0.3 map ``Role.RefPolicy`` unconditionally (``verl/trainer/main_ppo.py: main_task``, v0.3.0.post1
    lines 115/125) and ``RayPPOTrainer.fit`` computes the reference's log-probs every step; from 0.4 only with
    ``use_kl_loss`` or ``use_kl_in_reward``. TinyZero sets neither: 0.3 prices ref_log_prob, 0.9.1 does not and
    names the reference's micro size as not read."""
    old, new = tinyzero("0.3"), tinyzero("0.9.1")
    assert "ref_log_prob" in old["phases"] and "ref_log_prob" not in new["phases"]
    unread = {i["key"] for i in new["not_priced"] if i["effect"] == "not_read"}
    assert "actor_rollout_ref.ref.log_prob_micro_batch_size" in unread
    assert "actor_rollout_ref.ref.log_prob_micro_batch_size" not in {i["key"] for i in old["not_priced"]}


def test_the_update_keeps_a_gradient_of_the_logits_size_before_0_4():
    """flash-attn's cross-entropy wrote its gradient into the logits only from 0.4 (``logprobs_from_logits(...,
    inplace_backward=True)``, ``verl/utils/torch_functional.py``; v0.3.0.post1's ``logprobs_from_logits_flash_attn``
    has no such argument): 0.3's update holds an fp32 gradient of the logits (twice their bf16 bytes) that 0.9.1's
    does not, and its peak is higher by it."""
    old = tinyzero("0.3")["phases"]["update_actor"]
    new = tinyzero("0.9.1")["phases"]["update_actor"]
    assert old["terms"]["logits_grad"] == 2 * old["terms"]["logits"] and "logits_grad" not in new["terms"]
    assert old["peak_bytes"] > new["peak_bytes"]


def test_the_rollout_runs_1024_sequences_at_once_before_0_9():
    """``rollout.max_num_seqs`` was 1024 in every ppo_trainer.yaml to 0.8 (v0.3.0.post1 line 87) and is 256 in
    0.9's ``verl/trainer/config/rollout/rollout.yaml``: the same pool holds four times the sequences in flight."""
    assert "1,024 in flight (max_num_seqs 1,024)" in _run(str(TINYZERO), *README_EXPORTS, "--verl", "0.3")[1]
    assert "256 in flight (max_num_seqs 256)" in _run(str(TINYZERO), *README_EXPORTS, "--verl", "0.9.1")[1]


def test_vllm_0_6_3s_pool_is_a_share_of_what_is_free_at_start_up_in_0_1():
    """verl 0.1's vLLM 0.6.3 worker sizes the KV pool as ``gpu_memory_utilization`` × the memory still free once
    the models are loaded (``verl/third_party/vllm/vllm_v_0_6_3/worker.py: determine_num_available_blocks``); 0.3
    with vLLM ≥ 0.7 takes u × the whole GPU. So offloading the critic's parameters grows 0.1's pool and leaves
    0.3's as it is."""
    offload = "critic.model.fsdp_config.param_offload=true"
    kv = {v: tinyzero(v)["phases"]["generate"]["terms"]["kv_cache"] for v in ("0.1", "0.3")}
    moved = {v: tinyzero(v, offload)["phases"]["generate"]["terms"]["kv_cache"] for v in ("0.1", "0.3")}
    assert moved["0.1"] > kv["0.1"] and moved["0.3"] == kv["0.3"]


def test_gradient_checkpointing_was_off_by_default_in_0_1():
    """v0.1's ppo_trainer.yaml sets ``enable_gradient_checkpointing: False`` (actor and critic; True from v0.2):
    TinyZero's script leaves it unset, so 0.1 keeps every layer's activations through the update and OOMs there,
    and turning it on is the fix offered."""
    old = tinyzero("0.1")
    assert old["phases"]["update_actor"]["peak_bytes"] > tinyzero("0.3")["phases"]["update_actor"]["peak_bytes"]
    assert any(f["set"] == "actor_rollout_ref.model.enable_gradient_checkpointing=true" for f in old["fixes"])


def test_a_forks_script_is_answered_with_its_own_keys_named():
    """Search-R1's train_ppo.sh sets keys no verl release has (data.max_start_length, max_turns, retriever.*) and
    an old one (fsdp_config.grad_offload): memory answers it, naming each fork key as ignored for memory."""
    code, out = _run(
        str(SEARCH_R1), "--set", "DATA_DIR=data/nq_search", "--verl", "0.2", "--gpu", "H100-80GB", "--json"
    )
    doc = json.loads(out)
    assert code in (0, 1) and doc["phases"]
    fork = {i["key"] for i in doc["not_priced"] if i["effect"] == "not_verl"}
    assert {"data.max_start_length", "data.max_obs_length", "max_turns", "retriever.topk"} <= fork, fork


def test_remove_padding_was_off_by_default_until_0_7():
    """0.5's and 0.6's ppo_trainer.yaml set ``actor_rollout_ref.model.use_remove_padding: false`` (v0.5.0
    ``verl/trainer/config/ppo_trainer.yaml``; v0.6.1 ``_generated_ppo_trainer.yaml``); 0.7.1 sets it true. A config
    that leaves it unset is priced padded under 0.6 and packed under 0.7, and the answer says which."""
    config = ["--model", "Qwen2.5-7B", "actor_rollout_ref.actor.use_dynamic_bsz=true", "--json"]
    old = json.loads(_run(*config, "--verl", "0.6")[1])
    new = json.loads(_run(*config, "--verl", "0.7")[1])
    assert "padded to full width whatever the data" in old["lengths"]
    assert "padded" not in new["lengths"]
    assert old["phases"]["old_log_prob"]["peak_bytes"] > new["phases"]["old_log_prob"]["peak_bytes"]


def test_a_custom_entry_point_passing_verls_overrides_is_read_as_main_ppo(tmp_path, capsys):
    """verl's split-placement example launches its own main_ps.py with verl's overrides: memory answers it (the
    entry point named as read past, its arguments priced as main_ppo's); check keeps its strict refusal."""
    script = tmp_path / "run_deepseek7b_llm.sh"
    script.write_text(
        "python3 main_ps.py algorithm.adv_estimator=gae data.train_batch_size=256 "
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B actor_rollout_ref.actor.use_dynamic_bsz=true "
        "critic.ppo_micro_batch_size_per_gpu=4 \\\n    trainer.n_gpus_per_node=8\n"
    )
    code, out = _run(str(script), "--json")
    doc = json.loads(out)
    assert code == 0 and "values" in doc["phases"]  # GAE's critic: the overrides were read
    past = [i for i in doc["not_priced"] if i["effect"] == "read_past"]
    assert [i["key"] for i in past] == ["the entry point main_ps.py"]
    assert main(["check", str(script)]) == 2 and "main_ps.py is not modelled" in capsys.readouterr().err
