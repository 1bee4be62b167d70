"""Start-up failures as a phase of their own: which step of a verl run's start the text shows (the workers' model
init, weight loading, the rollout engine's build, its CUDA-graph capture, the first collective) and what usually
causes a failure there. verl starts in that order (``fsdp_workers.py``/``engine_workers.py``: ``init_model`` builds
the model and optimizer, then ``_build_rollout`` the engine, which loads its weights, sizes its KV cache and
captures CUDA graphs, issuing its TP group's collectives); a run that printed a ``step:N`` metrics line is past it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit.diagnose.log_lines import LogLine
from labkit.diagnose.log_nccl import NcclTimeout

# most telling first: a capture line says the engine got furthest
STAGES: tuple[tuple[str, re.Pattern, str], ...] = (
    (
        "CUDA-graph capture",
        re.compile(r"Capturing (?:batches|CUDA graph shapes|cudagraphs)|Capture cuda graph begin|\bcapture_model\b"),
        "the engine captures a CUDA graph per batch size and each capture issues its TP group's all-reduces: a TP "
        "peer still loading weights or building its engine leaves the others waiting (a watchdog on the rollout's "
        "TP group at a small SeqNum); the graphs also take memory beyond the KV pool. Check the slowest rank's "
        "loading (disk, host RAM); rollout.enforce_eager=True (vLLM) or disabling CUDA graphs (SGLang) skips the "
        "capture; a lower rollout.gpu_memory_utilization leaves it room",
    ),
    (
        "rollout engine build",
        re.compile(
            r"Before building (?:vllm|sglang|hf) rollout|\b_build_rollout\b|KV Cache is allocated|Memory pool end|"
            r"before init cache|\b_initialize_kv_caches\b|\bdetermine_num_available_blocks\b|"
            r"Init torch distributed begin|scheduler = Scheduler\(|\bTpModelWorker\("
        ),
        "the engine sizes its KV cache from rollout.gpu_memory_utilization × capacity minus what the GPU already "
        "holds: the training model and optimizer not yet offloaded, or another process on the GPU, leave too little "
        "(an OOM, or 'No available memory for the cache blocks'); its own TP group starts here (NCCL set-up)",
    ),
    (
        "weight loading",
        re.compile(r"Loading (?:safetensors |pt )?checkpoint shards|Load weight begin|\bload_model\b"),
        "every rank reads the checkpoint: host RAM (each process holds a full copy while it loads), a slow or shared "
        "disk (a rank still loading when its peers reach their first collective times out), a wrong path",
    ),
    (
        "model init",
        re.compile(r"\binit_model\b|\b_build_model_optimizer\b|wrap_policy:|Total steps: \d+, num_warmup_steps"),
        "building the actor, critic and ref: the HF model is materialised on each rank before FSDP or Megatron "
        "shards it (host RAM, or GPU without meta-device init), then the optimizer; a config or model-path error "
        "surfaces here too",
    ),
)
FIRST_COLLECTIVE = (
    "the ranks never all met in their first collective: NCCL's bootstrap or the network (NCCL_SOCKET_IFNAME, a "
    "firewall, InfiniBand), a rank that did not start or died, or a launcher (slurm) that placed the processes "
    "differently than the world size says"
)
STEP = re.compile(
    r"^step:\d+ - |Training Progress|Processed prompts|generating sequences|Initial validation metrics|val-core/"
)
"""Lines only a run past its start prints: a step's metrics, the trainer's progress bar, a rollout's progress, the
validation before training."""


@dataclass(frozen=True)
class StartupStage:
    """Which step of the start the failure came at, the line that shows it (the watchdog's, for the first
    collective) and what usually causes a failure there."""

    stage: str
    line: LogLine | None
    cause: str


def past_startup(lines: list[LogLine]) -> bool:
    """The run printed what only a started training loop prints: it is past its start."""
    return any(STEP.search(line.text.strip()) for line in lines)


def startup_stage(lines: list[LogLine], at: int, hangs: list[NcclTimeout]) -> StartupStage | None:
    """The start-up step the text before line ``at`` shows, or None when it shows none (or the run trained)."""
    if past_startup(lines):
        return None
    before = [line for line in lines if at - 400 <= line.number <= at]
    for stage, pattern, cause in STAGES:
        seen = [line for line in before if pattern.search(line.text)]
        if seen:
            return StartupStage(stage, seen[-1], cause)
    if hangs and all(t.seq == 1 and (t.last_completed is None or t.last_completed < 1) for t in hangs):
        first = next((line for line in lines if line.number == hangs[0].line), None)
        return StartupStage("first collective", first, FIRST_COLLECTIVE)
    return None
