"""``labkit diagnose``: real verl logs from public threads (tests/data/logs, each with what its thread
established), the same logs rewrapped as other terminals and Ray print them, logs labkit's own live runs write, a
log made from labkit's own prediction (the failed allocation must be found among the phase's tensors) and one whose
allocation matches nothing (it must say so)."""

from __future__ import annotations

import json
import pprint
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from labkit.diagnose.answer import diagnose_text
from labkit.diagnose.log_failures import to_bytes
from labkit.rules.catalogue import code_of

LOGS = Path(__file__).parent / "data" / "logs"
SLUGS = sorted(p.stem for p in LOGS.glob("*.log"))
KINDS = {"oom", "hang", "verl_error", "host_oom", "unknown"}
PHASES = {
    "generate",
    "old_log_prob",
    "ref_log_prob",
    "values",
    "update_actor",
    "update_critic",
    "weight_sync",
    "checkpoint",
    "init",
    None,
}


def _meta(slug: str) -> dict:
    return yaml.safe_load((LOGS / f"{slug}.yaml").read_text())


def _expected(meta: dict) -> tuple[str, str | None]:
    shows = meta.get("log_shows") or {}
    return shows.get("kind", meta["kind"]), shows.get("phase", meta["phase"])


def test_the_corpus_is_real_sourced_and_covers_the_failures():
    """At least 15 logs, each from a public thread; OOMs in four phases, NCCL timeouts, verl's messages, a host OOM."""
    assert len(SLUGS) >= 15
    metas = {s: _meta(s) for s in SLUGS}
    for slug, m in metas.items():
        assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", m["source"]), slug
        assert m["kind"] in KINDS and m["phase"] in PHASES, slug
        assert slug in (LOGS / "README.md").read_text()
    kinds = [m["kind"] for m in metas.values()]
    assert {"oom", "hang", "verl_error", "host_oom"} <= set(kinds)
    assert len({m["phase"] for m in metas.values() if m["kind"] == "oom" and m["phase"]}) >= 4
    text = "\n".join((LOGS / f"{s}.log").read_text() for s in SLUGS)
    assert not re.search(r"/home/(?!user/)\w+/", text), "a user name left in a path"


@pytest.mark.parametrize("slug", SLUGS)
def test_each_real_log_is_diagnosed_as_its_thread_established(slug):
    meta, text = _meta(slug), (LOGS / f"{slug}.log").read_text()
    kind, phase = _expected(meta)
    d = diagnose_text(text)
    assert (d.kind, d.phase) == (kind, phase), (d.kind, d.phase, d.lines)
    failing = meta.get("failing") or ""
    m = re.search(r"Tried to allocate ([0-9.]+) (GiB|MiB)", failing)
    if kind == "oom" and m:
        assert d.facts["allocation"]["requested"] == to_bytes(m.group(1), m.group(2))
        assert any(f"{float(m.group(1)):.2f} GiB" in line for line in d.lines) or m.group(2) == "MiB"
    if kind == "verl_error":
        assert d.code == code_of(failing.split(": ", 1)[-1]) and d.code is not None
    if kind == "hang":
        seqs = {int(x) for x in re.findall(r"SeqNum=(\d+)", text)}
        assert {t["seq"] for t in d.facts["nccl"]} == seqs
    assert d.exit_code in (0, 1)


def _rewrap(text: str, seed: int) -> str:
    """The same log as another run prints it: Ray's prefix and colours on every line, CRLF endings, progress bars
    redrawn with carriage returns, and unrelated lines in between."""
    rng = random.Random(seed)
    out = []
    for line in text.splitlines():
        if rng.random() < 0.3:
            out.append(
                f"\x1b[36m(TaskRunner pid={rng.randint(100, 999)})\x1b[0m Training Progress:  10%|█ | 1/10\r 20%|██"
            )
        prefix = (
            ""
            if line.startswith("(")
            else f"\x1b[36m(WorkerDict pid={rng.randint(1000, 9999)}, ip=10.0.0.{seed})\x1b[0m "
        )
        out.append(prefix + line + " [repeated 2x across cluster]" * (rng.random() < 0.1 and "Error" not in line))
    return "\r\n".join(out)


@pytest.mark.parametrize("slug", SLUGS)
def test_a_rewrapped_log_is_diagnosed_the_same(slug):
    text = (LOGS / f"{slug}.log").read_text()
    plain, wrapped = diagnose_text(text), diagnose_text(_rewrap(text, 1 + len(slug) % 7))
    assert (wrapped.kind, wrapped.phase, wrapped.code) == (plain.kind, plain.phase, plain.code)
    moved = ("line",)  # the inserted lines shift the line numbers
    assert {k: v for k, v in (wrapped.facts.get("allocation") or {}).items() if k not in moved} == {
        k: v for k, v in (plain.facts.get("allocation") or {}).items() if k not in moved
    }


CONFIG = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=256",
    "data.max_prompt_length=1024",
    "data.max_response_length=3072",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "trainer.n_gpus_per_node=8",
]


def _oom_log(requested_gib: float, config_first: bool) -> str:
    """A legacy run's log: the config (verl's dump or Hydra's list), the worker's frames, PyTorch's message."""
    frames = [
        "(TaskRunner pid=77) Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): "
        "ray::WorkerDict.actor_rollout_compute_log_prob() (pid=4242, ip=10.0.0.1)",
        '(WorkerDict pid=4242)   File "/verl/verl/workers/fsdp_workers.py", line 782, in compute_log_prob',
        '(WorkerDict pid=4242)   File "/verl/verl/utils/torch_functional.py", line 148, in entropy_from_logits',
        f"(WorkerDict pid=4242) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {requested_gib:.2f} GiB. "
        "GPU 0 has a total capacity of 79.19 GiB of which 2.07 GiB is free. Of the allocated memory 74.01 GiB is "
        "allocated by PyTorch, and 1.63 GiB is reserved by PyTorch but unallocated.",
    ]
    tree: dict = {}
    for item in CONFIG:
        key, value = item.split("=", 1)
        node = tree
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = int(value) if value.isdigit() else False if value == "false" else value
    dump = [f"(TaskRunner pid=77) {line}" for line in pprint.pformat(tree, width=80).splitlines()]  # as verl prints it
    return "\n".join(dump + frames if config_first else frames + [f"Error executing job with overrides: {CONFIG!r}"])


@pytest.mark.parametrize("config_first", [True, False])
def test_a_failed_allocation_of_a_predicted_tensor_is_named_with_the_fixes(config_first):
    """labkit's own sizes for this config: 16 rows × 4,096 tokens of old_log_prob, so the entropy's fp32 T × V is
    65,536 × 152,064 × 4 B; the log's request of that size is that tensor, the phase is over the GPU in labkit's
    model too, and each fix comes with its new peak and verl's verdict."""
    fp32 = 65536 * 152064 * 4
    d = diagnose_text(_oom_log(fp32 / 2**30, config_first))
    assert (d.kind, d.phase, d.model, d.profile) == ("oom", "old_log_prob", "Qwen2.5-7B", "legacy")
    assert any("65,536 tokens × 152,064 vocab × 4 B" in line for line in d.lines), d.lines
    assert d.explained and d.exit_code == 0 and d.facts["fixes"]
    assert all(f["phase"] == "old_log_prob" and f["new_peak_bytes"] > 0 for f in d.facts["fixes"])
    assert set(CONFIG) <= set(d.overrides) or not config_first


def test_an_allocation_that_matches_no_predicted_tensor_says_so():
    d = diagnose_text(_oom_log(3.33, False))
    assert any("matches none of the tensors" in line for line in d.lines), d.lines
    assert not any("the failed allocation: " in line for line in d.lines)


def _labkit(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("labkit")
    return subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_cli_exit_codes_json_and_standard_input(tmp_path):
    ok = _labkit("diagnose", str(LOGS / "verl-error-train-bsz-lt-mini-grpo.log"), "--json")
    doc = json.loads(ok.stdout)
    assert ok.returncode == 0 and doc["kind"] == "verl_error" and doc["code"] == "E9"
    assert {"kind", "phase", "code", "overrides", "model"} <= set(doc)
    died = _labkit("diagnose", "-", stdin=(LOGS / "unknown-actor-died-sigkill-grpo.log").read_text())
    assert died.returncode == 1 and "OOM killer" in died.stdout
    assert died.stdout.splitlines()[0].startswith("memory: ") and died.stdout.splitlines()[3].startswith("diagnosis: ")
    assert _labkit("diagnose", "-", stdin="all good\n").returncode == 2
    assert _labkit("diagnose", str(tmp_path / "missing.log")).returncode == 2
    binary = tmp_path / "bin.log"
    binary.write_bytes(b"\x00\x01" * 100)
    out = _labkit("diagnose", str(binary))
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_a_log_over_the_cap_is_read_from_its_end_quickly(tmp_path):
    big = tmp_path / "big.log"
    filler = "Training Progress:  10%|█         | 116/1155 [7:54:43<67:30:48, 233.93s/it]\n" * 120_000
    big.write_text(filler + (LOGS / "oom-old-log-prob-entropy-qwen32b-h800.log").read_text())
    out = _labkit("diagnose", str(big), "--json")
    doc = json.loads(out.stdout)
    assert doc["kind"] == "oom" and doc["phase"] == "old_log_prob"
    assert doc["answer"][0].startswith("memory: GPU") and "read the last 8 MiB" in doc["answer"][3]


def test_a_real_cpu_allocation_failure_is_read(tmp_path):
    """A real process whose address space is capped fails in torch's CPU allocator; its own stderr is the log (the
    script sits where verl's legacy workers do, so its frame is a worker method's)."""
    script = tmp_path / "verl" / "workers" / "fsdp_workers.py"
    script.parent.mkdir(parents=True)
    script.write_text(
        "import resource, torch\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2**34, 2**34))\n"
        "def compute_log_prob():\n"
        "    return torch.empty(2**36, dtype=torch.uint8)\n"
        "compute_log_prob()\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "DefaultCPUAllocator" in proc.stderr, proc.stderr[-500:]
    d = diagnose_text(proc.stderr)
    assert d.kind == "oom" and d.facts["allocation"] == {
        "device": "cpu",
        "line": d.facts["allocation"]["line"],
        "requested": 2**36,
    }
    assert d.phase == "old_log_prob" and d.lines[0].startswith("memory: host")


def test_the_hang_labs_own_report_is_read_back():
    """A live hang (a): two real ranks, dynamic batch size without the MAX sync; the lab's report is the log."""
    from labkit.hangs.reproduce import unsynced_dynamic_bsz

    run = unsynced_dynamic_bsz(fix=False)
    d = diagnose_text(run.diagnosis.text())
    assert (d.kind, d.phase, d.explained) == ("hang", run.diagnosis.stage, True)
    assert any("fewer, so the call never completes" in line for line in d.lines), d.lines


@pytest.mark.parametrize("slug", SLUGS)
def test_every_answer_opens_with_memory_phase_and_config_each_citing_its_line(slug):
    """The three lines verl's triage asks for come first; the phase line quotes a line of the log that names it
    (a frame, a task, a driver call, a start-up or memory log line), the memory line the failure's line."""
    from labkit.diagnose.log_lines import log_lines

    text = (LOGS / f"{slug}.log").read_text()
    d = diagnose_text(text)
    memory, phase, config = d.lines[:3]
    assert memory.startswith("memory: ") and phase.startswith("phase: ") and config.startswith("config: ")
    assert phase.startswith(f"phase: {d.phase}" if d.phase else "phase: not named")
    by_number = {line.number: line.text.strip() for line in log_lines(text)}
    cited = re.search(r"\(line (\d+): (.*)\)$", phase)
    if d.phase is not None:
        assert cited, phase
        quoted = cited.group(2).rstrip("…")
        assert by_number[int(cited.group(1))].startswith(quoted)
    if d.kind == "oom":
        assert f"(line {d.facts['allocation']['line']}: " in memory
    assert ("not found" in config) == (not d.overrides)


def _pytorch_oom(requested: str, capacity: str, free: str, holders: str, allocated: str, unallocated: str) -> str:
    """PyTorch's OOM text in its own format (c10/cuda/CUDACachingAllocator.cpp), the holders as NVML lists them."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {requested}. GPU 0 has a total capacity of "
        f"{capacity} of which {free} is free. {holders}Of the allocated memory {allocated} is allocated by PyTorch, "
        f"and {unallocated} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )


def test_a_gpu_held_by_another_process_is_told_from_fragmentation_and_a_peak():
    shared = _pytorch_oom(
        "2.00 GiB",
        "31.73 GiB",
        "120.00 MiB",
        "Process 4416 has 30.51 GiB memory in use. Including non-PyTorch memory, this process has 1.10 GiB memory "
        "in use. ",
        "594.00 MiB",
        "20.00 MiB",
    )
    d = diagnose_text(shared)
    assert d.facts["held_by"] == "shared" and d.facts["other_processes"] == [{"pid": 4416, "bytes": int(30.51 * 2**30)}]
    answer = "\n".join(d.lines)
    assert "process 4416 30.51 GiB" in answer and "Free the GPU" in answer and "not fragmentation" not in answer
    assert "the peak itself must come down" not in answer and d.explained
    fragmented = _pytorch_oom("2.00 GiB", "79.19 GiB", "1.00 GiB", "", "70.00 GiB", "6.50 GiB")
    assert diagnose_text(fragmented).facts["held_by"] == "fragmentation"
    peak = _pytorch_oom("2.00 GiB", "79.19 GiB", "1.00 GiB", "", "76.00 GiB", "200.00 MiB")
    assert diagnose_text(peak).facts["held_by"] == "peak"
    # real logs: SGLang's scheduler child on the GPU (13.01 GiB) is another holder; a container lists this process by
    # pid (verl#2828's 70.25 GiB, RAGEN's 19.96 GiB): it is not another holder; two small holders (RLinf) do not count
    held = {s: diagnose_text((LOGS / f"{s}.log").read_text()).facts.get("held_by") for s in SLUGS}
    assert held["oom-sglang-rollout-gh200"] == "shared"
    assert held["oom-old-log-prob-entropy-qwen32b-h800"] == "peak"
    assert held["oom-self-listed-by-pid-ragen-4090"] == "peak"
    assert held["oom-small-other-holders-rlinf"] == "peak"
    assert held["oom-update-actor-backward-easyr1"] == "fragmentation"  # its message hard-wrapped mid-word


FORK_FRAMES = {
    # EasyR1's spelling of the worker methods (verl/workers/fsdp_workers.py of hiyouga/EasyR1)
    "old_log_prob": '  File "/EasyR1/verl/workers/fsdp_workers.py", line 520, in compute_log_probs',
    "ref_log_prob": '  File "/EasyR1/verl/workers/fsdp_workers.py", line 548, in compute_ref_log_probs',
    "init": '  File "/verl/verl/workers/fsdp_workers.py", line 1036, in init_model',
    "update_actor": "ray::WorkerDict.actor_rollout_ref_update_actor() (pid=1, ip=10.0.0.1)",
}


@pytest.mark.parametrize("phase", sorted(FORK_FRAMES))
def test_the_phase_is_read_from_forks_frames_task_names_and_a_glued_progress_bar(phase):
    bar = "Training Progress:  10%|█         | 116/1155 [7:54:43<67:30:48, 233.93s/it]"
    for error in (
        "AssertionError: critic warmup",
        _pytorch_oom("1.00 GiB", "79.19 GiB", "0.50 GiB", "", "77 GiB", "0 B"),
    ):
        d = diagnose_text("\n".join(["Traceback (most recent call last):", FORK_FRAMES[phase], bar + error]))
        assert d.phase == phase, d.lines
    d = diagnose_text("\n".join([FORK_FRAMES[phase], bar + error]))
    assert d.kind == "oom" and d.facts["allocation"]["requested"] == 2**30


def test_startup_failures_are_a_phase_of_their_own_with_their_step_and_cause():
    capture = diagnose_text((LOGS / "hang-init-sglang-capture-mesh-tp-seqnum3.log").read_text())
    assert (capture.kind, capture.phase, capture.facts["startup"]) == ("hang", "init", "CUDA-graph capture")
    assert capture.facts["nccl"][0]["group"] == "mesh_tp" and capture.facts["nccl"][0]["rank"] == 7
    assert any("TP group" in line for line in capture.lines)
    first = diagnose_text((LOGS / "hang-init-allreduce-seqnum1-slurm.log").read_text())
    assert first.facts["startup"] == "first collective"
    engine = diagnose_text((LOGS / "unknown-sglang-init-model-runner.log").read_text())
    assert engine.facts["startup"] == "rollout engine build"
    # a run that trained is past its start: the same capture lines then name no start-up phase
    trained = (
        "step:3 - perf/max_memory_allocated_gb:61.2\n"
        + (LOGS / "hang-init-sglang-capture-mesh-tp-seqnum3.log").read_text()
    )
    assert diagnose_text(trained).phase is None


def test_verls_memory_log_lines_are_read_as_measurements_beside_the_prediction():
    d = diagnose_text((LOGS / "unknown-megatron-npu-memory-log.log").read_text())
    assert d.phase == "update_actor" and "memory log" in d.lines[1]
    first = d.facts["memory_log"][0]
    assert (first["allocated"], first["reserved"], first["used"], first["total"]) == (45.14, 52.16, 10.25, 60.96)
    logged = (
        "Before compute_log_prob, memory allocated (GB): 40.12, memory reserved (GB): 44.00, device memory "
        "used/total (GB): 45.10/79.19\n" + _oom_log(65536 * 152064 * 4 / 2**30, False)
    )
    priced = diagnose_text(logged)
    assert any("labkit's prediction for old_log_prob" in line for line in priced.lines)
    assert any("allocated 40.12, reserved 44.00, device used 45.10 of 79.19" in line for line in priced.lines)


def test_the_paste_box_shows_one_answer_the_users_once_pasted():
    """While empty the box reads the lesson's example and says so; a pasted log replaces it entirely (nothing of
    the example's answer stays), and clearing the box brings the example back."""
    from labkit.ui.diagnose_panel import diagnose_box

    example = (LOGS / "oom-old-log-prob-entropy-qwen32b-h800.log").read_text()
    box = diagnose_box("", example=example, example_source="verl-project/verl#2828")
    area, shown = box.children
    assert (
        box.showing == "example"
        and box.diagnosis.kind == "oom"
        and "the example (verl-project/verl#2828)" in shown.value
    )
    area.value = (LOGS / "hang-sft-alltoall-epoch-transition.log").read_text()
    assert box.showing == "yours" and box.diagnosis.kind == "hang"
    assert "example" not in shown.value and "13.91 GiB" not in shown.value and "ALLTOALL" in shown.value
    area.value = "   "
    assert box.showing == "example" and box.diagnosis.phase == "old_log_prob"


VLLM_START_CONFIG = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    "data.train_batch_size=256",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.9",
    "trainer.n_gpus_per_node=8",
]


@pytest.mark.parametrize("device", ["", " cuda:0"])
def test_vllms_start_up_memory_check_is_generates_oom_with_the_fixes_memory_gives(device):
    """vLLM V1 refuses to start when the free memory is below u·C (its message with and without the device name,
    as vLLM printed it before and after naming the device). diagnose reads it as the generate phase's OOM, with
    the log's figures, labkit's prediction for generate on that GPU, and the same fixes `labkit memory` gives."""
    from labkit.config.verl_config import load_config
    from labkit.memory.choice import settings_for
    from labkit.memory.verdict import memory_report

    log = "\n".join(
        [
            "(WorkerDict pid=4242) ERROR 06-30 13:53:19 [core.py:515] EngineCore failed to start.",
            f"(WorkerDict pid=4242) ValueError: Free memory on device{device} (13.91/79.33 GiB) on startup is less than "
            "desired GPU memory utilization (0.9, 71.40 GiB). Decrease GPU memory utilization or reduce GPU memory "
            "used by other processes.",
            f"Error executing job with overrides: {VLLM_START_CONFIG!r}",
        ]
    )
    d = diagnose_text(log)
    assert (d.kind, d.phase, d.model) == ("oom", "generate", "Qwen2.5-7B"), d.text()
    a = d.facts["allocation"]
    assert a["device"] == "engine-start" and a["share"] == 0.9
    assert (a["free"], a["capacity"], a["requested"]) == tuple(to_bytes(x, "GiB") for x in ("13.91", "79.33", "71.40"))
    assert any("65.42 GiB was already held" in line for line in d.lines), d.lines
    assert any("more was held by something it does not model" in line for line in d.lines), d.lines  # 65 ≫ model
    cfg = load_config(None, VLLM_START_CONFIG, profile=d.profile)
    rep = memory_report(cfg, settings_for(cfg, capacity=a["capacity"]))
    assert rep.first_oom == "generate" and d.explained and d.exit_code == 0
    memory_fixes = [f["set"] for f in rep.fixes if f["phase"] == "generate"]
    assert [f["set"] for f in d.facts["fixes"]] == memory_fixes and memory_fixes


def test_sglangs_no_room_for_its_pool_is_generate_and_says_whether_labkit_explains_it():
    """SGLang's start-up error (no KV room at its mem_fraction_static): generate, explained as the engine's share;
    where labkit's own model gives the engine a pool, the answer says it does not explain it, lists no fixes of
    another failure, and names the GPU it assumed; where labkit's engine has no room either, memory's fixes come."""
    base = [*VLLM_START_CONFIG[:-2], "actor_rollout_ref.rollout.name=sglang", "trainer.n_gpus_per_node=8"]

    def answer(share: str):
        config = [*base, f"actor_rollout_ref.rollout.gpu_memory_utilization={share}"]
        log = "\n".join(
            [
                "(WorkerDict pid=11) [2025-05-11 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent "
                "call last):",
                "(WorkerDict pid=11) RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
                f"Error executing job with overrides: {config!r}",
            ]
        )
        return diagnose_text(log)

    d = answer("0.5")
    assert (d.kind, d.phase) == ("oom", "generate") and d.explained and "fixes" not in d.facts
    assert any("so it does not explain this failure" in line and "(assumed" in line for line in d.lines), d.lines
    d = answer("0.02")  # u·C = 1.6 GiB: below the engine's weights in labkit's model too
    assert any(line.startswith("priced on 79.65 GiB GPUs") for line in d.lines), d.lines
    assert d.facts["fixes"] and all(f["phase"] == "generate" for f in d.facts["fixes"])
    assert any(f["set"].startswith("actor_rollout_ref.rollout.gpu_memory_utilization=") for f in d.facts["fixes"])
