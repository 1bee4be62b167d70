"""The phase a failure happened in, from what the text around it names: traceback frames (``File "…", line n, in
compute_log_prob``), Ray's task names (``ray::WorkerDict.actor_rollout_compute_log_prob``), the driver's
worker-group calls quoted under its frames (``ref_log_prob = self.ref_policy_wg.compute_ref_log_prob(batch)``), in
verl's releases and in the forks built on its single controller (EasyR1's ``compute_log_probs`` and
``compute_ref_log_probs``, TinyZero, Search-R1, RAGEN, ...: the same worker methods). The most specific phase wins
(the ref's ``compute_ref_log_prob`` calls the same ``compute_log_prob`` as the actor; the weight sync runs inside
``generate_sequences``). Start-up (``init_model``, ``_build_rollout``, ...) is a phase of its own
(``labkit.diagnose.log_startup`` says which step). When nothing names a phase, verl's own memory log lines
(``GPUMemoryLogger``: "Before update_policy, memory allocated (GB): …" without its "After") say which call was
running; that reading is marked as such."""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit.diagnose.log_lines import LogLine

FRAME = re.compile(r'File "(?P<file>[^"]+)", line \d+, in (?P<func>[\w<>.]+)')
RAY_TASK = re.compile(r"ray::(?:\w+\.)?(?P<method>\w+)")
WG_CALL = re.compile(r"\bself\.(?P<wg>\w+)\.(?P<method>\w+)\(")
"""A call the driver or a worker quotes under its frame: ``self.ref_policy_wg.compute_ref_log_prob(batch)``,
``self.async_rollout_manager.generate_sequences(...)``, ``self.actor.update_policy(data=data)``."""
VERL_FILE = re.compile(r"/workers/|/trainer/|_workers\.py$|/single_controller/")
"""Files whose frames name verl's worker methods (verl's and its forks' worker and trainer trees). A method of the
same name elsewhere is another project's helper (slime's ``compute_log_probs`` is a loss utility), not a phase."""
# most specific first: a phase whose functions appear wins over the ones below it
PHASES: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "checkpoint",
        frozenset({"save_checkpoint", "load_checkpoint", "_save_checkpoint", "_load_checkpoint", "save_model"}),
    ),
    (
        "weight_sync",
        frozenset(
            {
                "rollout_mode",
                "sync_weights",
                "_sync_weights",
                "sync_rollout_weights",
                "update_weights",
                "update_weights_from_tensor",
                "wake_up",
                "resume_memory_occupation",
                "load_weights",
                "update_params",
            }
        ),
    ),
    (
        "ref_log_prob",
        frozenset(
            {"compute_ref_log_prob", "compute_ref_log_probs", "ref_compute_log_prob", "ref_compute_ref_log_prob"}
        ),
    ),
    ("values", frozenset({"compute_values"})),
    ("update_critic", frozenset({"update_critic"})),
    ("update_actor", frozenset({"update_actor", "update_policy"})),
    ("old_log_prob", frozenset({"compute_log_prob", "compute_log_probs", "compute_old_log_prob"})),
    (
        "generate",
        frozenset(
            {
                "generate_sequences",
                "async_generate",
                "generate_sequences_async",
                "_initialize_kv_caches",
                "determine_num_available_blocks",
                "profile_run",
                "event_loop_overlap",
                "event_loop_normal",
            }
        ),
    ),
)
INIT = frozenset(
    {
        "init_model",
        "init_workers",
        "_build_model_optimizer",
        "_build_rollout",
        "_build_critic_model_optimizer",
        "_init_model_runner",
        "init_model_worker",
    }
)
"""Start-up: the workers' ``init_model`` (model, optimizer, rollout engine), the driver's ``init_workers``."""
STEP_PHASES = frozenset(p for p, _ in PHASES)
ENGINE_NAMES = frozenset(
    {
        "wake_up",
        "update_weights_from_tensor",
        "resume_memory_occupation",
        "load_weights",
        "update_params",
        "_initialize_kv_caches",
        "determine_num_available_blocks",
        "profile_run",
        "event_loop_overlap",
        "event_loop_normal",
        "_init_model_runner",
        "init_model_worker",
    }
)
"""Names the rollout engines' own frames carry (vLLM, SGLang): read in any file."""
WORKER_METHODS = frozenset().union(*(f for _, f in PHASES), INIT) - ENGINE_NAMES
"""verl's worker and trainer methods: read from frames in verl's trees, Ray task names and quoted calls only."""
ROLE_PREFIXES = ("actor_rollout_ref_", "actor_rollout_", "critic_", "rollout_", "actor_", "ref_")
BEFORE, AFTER = 400, 60
"""Lines around a failure whose frames and task names count (a traceback above it; Ray's task header below)."""
PROGRESS = (
    (
        "generate",
        re.compile(
            r"VLLM generating sequences with batch size|Processed prompts:|Writing input of failed execution|"
            r"err_execute_model_input"
        ),
        "a generation log line",
    ),
)
"""Log lines that only a phase prints (verl's legacy vLLM rollout, vLLM's progress bar and its failed-execution
dump): read when no frame, task or call names a phase."""
MEMORY_LOGGER = re.compile(r"\b(?P<when>Before|After) (?P<func>\w+), memory allocated \(GB\)")


@dataclass(frozen=True)
class PhaseReading:
    """The phase, the names that decided it and the line that names it first (None: no line names a phase)."""

    phase: str | None
    names: list[str]
    line: LogLine | None = None
    how: str = "frames"


def _names_of(line: LogLine) -> set[str]:
    names = set()
    m = FRAME.search(line.text)
    if m:
        func = m.group("func")
        found = {func, func.lstrip("_")}  # the v1 driver's _update_actor, _compute_ref_log_prob, ...
        names |= found if VERL_FILE.search(m.group("file")) else found - WORKER_METHODS
        if func == "__enter__" and "sharding_manager" in m.group("file"):
            names.add("sync_weights")  # legacy: the sharding manager's enter loads the weights into the engine
    for t in RAY_TASK.finditer(line.text):
        method = t.group("method")
        names.add(method)
        for prefix in ROLE_PREFIXES:
            if method.startswith(prefix):
                rest = method[len(prefix) :]
                names.add(("ref_" + rest) if prefix == "ref_" and "log_prob" in rest else rest)
                break
    for c in WG_CALL.finditer(line.text):
        if c.group("method") in WORKER_METHODS:
            names.add(c.group("method"))
    return names


def phase_near(lines: list[LogLine], number: int) -> PhaseReading:
    """The phase the frames, task names and driver calls around line ``number`` point at."""
    near = [line for line in lines if number - BEFORE <= line.number <= number + AFTER]
    per_line = [(line, _names_of(line)) for line in near]
    names = set().union(*(n for _, n in per_line)) if per_line else set()
    if names & INIT:  # the workers' start: loading weights there is not a step's weight sync
        names -= {"load_weights", "update_params"}
    for phase, funcs in PHASES:
        hit = sorted(names & funcs)
        if hit:
            return PhaseReading(phase, hit, next(line for line, n in per_line if n & funcs))
    hit = sorted(names & INIT)
    if hit:
        return PhaseReading("init", hit, next(line for line, n in per_line if n & INIT))
    for phase, pattern, what in PROGRESS:
        seen = [line for line in near if pattern.search(line.text)]
        if seen:
            return PhaseReading(phase, [], seen[-1], how=what)
    return _from_memory_logger([line for line in lines if line.number <= number])


def _from_memory_logger(lines: list[LogLine]) -> PhaseReading:
    """The call verl's memory logger saw start and not end (the last "Before f" without an "After f" below it)."""
    ended: set[str] = set()
    for line in reversed(lines):
        m = MEMORY_LOGGER.search(line.text)
        if not m:
            continue
        func = m.group("func")
        if m.group("when") == "After":
            ended.add(func)
            continue
        if func in ended:
            return PhaseReading(None, [])
        for phase, funcs in PHASES:
            if func in funcs:
                return PhaseReading(phase, [func], line, how="verl's memory log (a call that began and did not end)")
        return PhaseReading(None, [])
    return PhaseReading(None, [])


def failing_frame(lines: list[LogLine], number: int) -> tuple[str, str] | None:
    """The innermost frame of the failure at line ``number`` (function, file): where it was raised. Python prints
    the frames above the exception line; Ray's ``RayTaskError(X): ray::…`` header comes first and its frames below."""
    header = next((x for x in lines if x.number == number), None)
    if header is not None and "RayTaskError(" in header.text:
        below = []
        for x in (x for x in lines if number < x.number <= number + AFTER):
            if not x.text.startswith((" ", "\t")):
                break
            m = FRAME.search(x.text)
            if m:
                below.append((m.group("func"), m.group("file").split("site-packages/")[-1]))
        if below:
            return below[-1]
    for line in reversed([x for x in lines if number - BEFORE <= x.number < number]):
        m = FRAME.search(line.text)
        if m:
            return m.group("func"), m.group("file").split("site-packages/")[-1]
    return None
