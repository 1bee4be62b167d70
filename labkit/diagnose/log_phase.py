"""The phase a failure happened in, from the traceback frames and Ray's task names around it: verl's worker methods
(``compute_log_prob``, ``update_actor``, ...) named in labkit's phase names, the most specific one winning (the ref's
``compute_ref_log_prob`` calls the same ``compute_log_prob`` as the actor; the weight sync runs inside
``generate_sequences``)."""

from __future__ import annotations

import re

from labkit.diagnose.log_lines import LogLine

FRAME = re.compile(r'File "(?P<file>[^"]+)", line \d+, in (?P<func>[\w<>.]+)')
RAY_TASK = re.compile(r"ray::(?:\w+\.)?(?P<method>\w+)")
# most specific first: a phase whose functions appear wins over the ones below it
PHASES: tuple[tuple[str, frozenset[str]], ...] = (
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
                "load_weights",
                "update_params",
            }
        ),
    ),
    ("ref_log_prob", frozenset({"compute_ref_log_prob", "ref_compute_log_prob", "ref_compute_ref_log_prob"})),
    ("values", frozenset({"compute_values"})),
    ("update_critic", frozenset({"update_critic"})),
    ("update_actor", frozenset({"update_actor", "update_policy"})),
    ("old_log_prob", frozenset({"compute_log_prob", "compute_old_log_prob"})),
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
            }
        ),
    ),
)
ROLE_PREFIXES = ("actor_rollout_ref_", "actor_rollout_", "critic_", "rollout_", "actor_")
BEFORE, AFTER = 400, 60
"""Lines around a failure whose frames and task names count (a traceback above it; Ray's task header below)."""


def _names(lines: list[LogLine]) -> set[str]:
    names = set()
    for line in lines:
        m = FRAME.search(line.text)
        if m:
            func = m.group("func")
            names |= {func, func.lstrip("_")}  # the v1 driver's _update_actor, _compute_ref_log_prob, ...
            if func == "__enter__" and "sharding_manager" in m.group("file"):
                names.add("sync_weights")  # legacy: the sharding manager's enter loads the weights into the engine
        for t in RAY_TASK.finditer(line.text):
            method = t.group("method")
            names.add(method)
            for prefix in ROLE_PREFIXES:
                if method.startswith(prefix):
                    names.add(method[len(prefix) :])
                    break
            if method.startswith("ref_") and "log_prob" in method:
                names.add("ref_compute_log_prob")
    return names


def phase_near(lines: list[LogLine], number: int) -> tuple[str | None, list[str]]:
    """The phase the frames and task names around line ``number`` point at, and the names that decided it."""
    near = [line for line in lines if number - BEFORE <= line.number <= number + AFTER]
    names = _names(near)
    if "init_model" in names:  # the workers' start: loading weights there is not a step's weight sync
        names -= {"load_weights", "update_params"}
    for phase, funcs in PHASES:
        hit = sorted(names & funcs)
        if hit:
            return phase, hit
    return None, []


def failing_frame(lines: list[LogLine], number: int) -> tuple[str, str] | None:
    """The innermost frame above line ``number`` (function, file): where the failure was raised."""
    for line in reversed([x for x in lines if number - BEFORE <= x.number < number]):
        m = FRAME.search(line.text)
        if m:
            return m.group("func"), m.group("file").split("site-packages/")[-1]
    return None
