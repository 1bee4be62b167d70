"""Claims of the first post about the rollout and its per-GPU table, its error table and its command-line tips
(claims p1-18 to p1-29): the rollout mesh, how prompts reach the TP groups, the per-card numbers, and what verl
raises or accepts, checked on labkit's plan of the worked example and its variants.
"""

from __future__ import annotations

from labkit.config.messages import ConfigError
from labkit.memory.gpus import gpu
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import step_phases
from labkit.rules.catalogue import catalogue, message
from labkit.ui.seed_claims.probe import (
    DYNAMIC,
    LEGACY,
    OLD,
    REF,
    V0,
    V1,
    A,
    R,
    config,
    first_error,
    per_rank,
    trace,
)
from labkit.ui.seed_claims.record import Case, Checked, claim

GROUP = "rollout, per-card table, errors and tips (post 1)"
N = 12
W8 = ("trainer.n_gpus_per_node=8", "data.train_batch_size=64", f"{A}.ppo_mini_batch_size=64")


def _prompts(row_range: list[int]) -> int:
    """Distinct prompts in a range of rows repeated n times, interleaved (a prompt's samples are adjacent)."""
    return len({i // N for i in range(*row_range)})


@claim("p1-18", GROUP, "F13", "≤0.5, 0.6–0.8, 0.9.1 v0")
def rollout_mesh_2d() -> Checked:
    """_build_rollout builds a 2-D device mesh (dp, infer_tp) = [[0, 1], [2, 3], [4, 5]]."""
    cases = []
    for v in (OLD, LEGACY, V0):
        mesh = trace(v).summary["rollout_mesh"]
        cases.append(Case("mesh dimensions", ["dp", "infer_tp"], mesh["dims"], v))
        cases.append(Case("TP groups", [[0, 1], [2, 3], [4, 5]], mesh["groups"], v))
    mesh = trace(LEGACY).summary["rollout_mesh"]
    shape = tuple(mesh[d] for d in mesh["dims"])
    return cases, [message("F13", name="rollout", dims=", ".join(mesh["dims"]), shape=shape)]


@claim("p1-19", GROUP, "F2", "≤0.5, 0.6–0.8, 0.9.1 v1")
def prompts_per_tp_group() -> Checked:
    """The 60 prompts are split evenly over the 3 TP groups: 20 prompts each, 20 × 12 = 240 completions per group,
    3 × 240 = 720 in all."""
    cases = []
    for v in (OLD, LEGACY, V1):
        gen = [r for r in trace(v).at("generate") if r.tp_rank == 0]
        seen = (
            sorted({_prompts(r.extra["row_range"]) for r in gen}),
            sorted({r.rows for r in gen}),
            sum(r.rows for r in gen),
        )
        if not gen:  # the v1 loop routes each session on its own: the planner draws no per-group partition
            seen = f"no fixed partition: {trace(v).stage('generate').formula}"
        cases.append(Case("prompts per TP group, rows per TP group, rows in all", ([20], [240], 720), seen, v))
    return cases, [trace(LEGACY).stage("generate").note]


@claim("p1-20", GROUP, "F2", "≤0.5, 0.6–0.8, 0.9.1 v0")
def results_all_gathered() -> Checked:
    """TP traffic stays inside a group over NVLink; the DP groups only exchange their results through a
    low-frequency all-gather."""
    cases = []
    for v in (OLD, LEGACY, V0):
        gen = trace(v).at("generate")
        held = max(r.extra["rows_out"] for r in gen)
        cases.append(Case("rows of results a GPU holds after generation (720 if all-gathered)", 720, held, v))
    notes = [
        f"[{v}] generate collectives per GPU: {trace(v).at('generate')[0].collectives or 'none'}" for v in (OLD, LEGACY)
    ]
    notes.append(f"[{OLD}] the one all-gather gathers a TP group's inputs, inside the group")
    notes.append(
        "the driver collects each group's rows (collect of the dispatch, Ray from 0.8 on) and concatenates them"
    )
    return cases, notes


@claim("p1-21", GROUP, "F2", "0.6–0.8, 0.9.1 v1")
def strictly_even_split() -> Checked:
    """The prompts are split strictly evenly, so no GPU sits idle."""
    cases = []
    for v in (LEGACY, V1):
        loop = trace(v).summary["agent_loop"]
        shares = loop.get("sessions_per_worker") or [loop["per_worker"]] * loop["A"]
        cases.append(Case("samples per agent-loop worker all equal", True, len(set(shares)) == 1, v))
    toks = [r.tokens for r in trace(LEGACY, lengths="gsm8k-like").at("generate") if r.tp_rank == 0]
    cases.append(Case("tokens per TP group equal (gsm8k-like lengths)", True, len(set(toks)) == 1, LEGACY, caveat=True))
    notes = [
        f"[{V1}] samples per agent-loop worker: {trace(V1).summary['agent_loop']['sessions_per_worker']}",
        f"[{LEGACY}] tokens per TP group with gsm8k-like lengths: {toks}",
    ]
    return cases, notes


@claim("p1-22", GROUP, "F13", "0.6–0.8, 0.9.1 v0")
def tp_and_sp_orthogonal() -> Checked:
    """Rollout tensor parallelism and Ulysses sequence parallelism are orthogonal: TP belongs to the inference
    engine, SP to the actor's training."""
    cases = []
    sp = (f"{A}.ulysses_sequence_parallel_size=2", f"{REF}.ulysses_sequence_parallel_size=2")
    for v in (LEGACY, V0):
        d = [trace(v, *W8, *sp, f"{R}.tensor_model_parallel_size={tp}").summary["D"] for tp in (1, 2, 4)]
        groups = [trace(v, *W8, *(sp if s > 1 else ())).summary["rollout_mesh"]["groups"] for s in (1, 2)]
        cases.append(Case("actor DP size with rollout TP 1, 2, 4 (sp=2, 8 GPUs)", [4, 4, 4], d, v))
        cases.append(Case("rollout TP groups the same with sp 1 and 2", True, groups[0] == groups[1], v))
    return cases


@claim("p1-23", GROUP, "F6", "≤0.5, 0.6–0.8")
def prompts_per_card() -> Checked:
    """Each card receives 60 ÷ 6 × 2 = 20 input prompts."""
    cases = []
    for v in (OLD, LEGACY):
        r = trace(v).at("generate")[1]  # a TP rank 1, not the collecting rank
        rows_in = r.extra["rows_in"]
        own = r.extra.get("own_row_range", r.extra["row_range"])
        cases.append(Case("prompts that reach one GPU", 60 // 6 * 2, _prompts(own), v))
        cases.append(Case("rows that reach one GPU", 20 * N, rows_in, v))
    r = trace(OLD).at("generate")[1].extra
    return cases, [message("F6", mode="DP_COMPUTE_PROTO (≤0.5)", rows_in=r["rows_in"], rows=r["rows_gathered"])]


@claim("p1-24", GROUP, "E20", "0.6–0.8, 0.9.1 v1")
def update_rows_per_card() -> Checked:
    """Each card updates the actor on 720 ÷ 6 = 120 samples."""
    return [
        Case("update rows per GPU", [720 // 6], sorted(set(per_rank(trace(v), "update_actor"))), v)
        for v in (LEGACY, V1)
    ]


@claim("p1-25", GROUP, "E20", "0.6–0.8")
def normalization_error_meaning() -> Checked:
    """The error 'ppo_mini_batch_size should be larger than 0 after normalization' means that train_batch_size ×
    n is not divisible by the number of GPUs."""
    bad_bn = ("data.train_batch_size=7", f"{R}.n=1", f"{A}.ppo_mini_batch_size=7")
    e20 = (
        "data.train_batch_size=4",
        f"{R}.n=2",
        "trainer.n_gpus_per_node=8",
        f"{A}.ppo_mini_batch_size=1",
        f"{A}.ppo_micro_batch_size_per_gpu=1",
        f"{R}.tensor_model_parallel_size=1",
    )
    err = first_error(LEGACY, *bad_bn)
    cfg = config(LEGACY, *e20)
    hit = first_error(LEGACY, *e20)
    cases = [
        Case("B=7, n=1 on 6 GPUs (B·n % W ≠ 0): the first error", "E20", err[0]),
        Case(
            f"the config that does raise it ({hit[0]}): B·n % W ≠ 0",
            True,
            cfg.get("data.train_batch_size") * cfg.get(f"{R}.n") % cfg.n_gpus != 0,
        ),
    ]
    return cases, [f"B=7, n=1: {err[0]}: {err[2]}", f"B=4, n=2, M=1 on 8 GPUs: {hit[0]}: {hit[2]}"]


def _logprob_peak(version: str, *overrides: str) -> int:
    cfg = config(version, *overrides)
    return step_phases(cfg, MemorySettings.from_config(cfg, "Qwen2.5-7B", gpu("H100-80GB").memory_bytes))[
        "old_log_prob"
    ].peak_bytes


@claim("p1-26", GROUP, "F12", "0.6–0.8, 0.9.1 v1")
def lower_logprob_micro_for_oom() -> Checked:
    """An out-of-memory error in compute_log_prob is relieved by lowering log_prob_micro_batch_size_per_gpu
    (8 → 4 → 2)."""
    cases, notes = [], []
    key = f"{R}.log_prob_micro_batch_size_per_gpu"
    for v in (LEGACY, V1):
        peaks = [_logprob_peak(v, f"{key}={m}") for m in (8, 4, 2)]
        cases.append(Case("log-prob peak falls from 8 to 4 to 2 rows", True, peaks[0] > peaks[1] > peaks[2], v))
        notes.append(f"[{v}] old_log_prob peak (Qwen2.5-7B): " + " → ".join(f"{p / 2**30:.2f}" for p in peaks) + " GiB")
    dyn = [_logprob_peak(LEGACY, *DYNAMIC, f"{key}={m}") for m in (8, 2)]
    notes.append(
        f"[{LEGACY}] with log_prob_use_dynamic_bsz the micro size is not read: peak {dyn[0] / 2**30:.2f} "
        f"→ {dyn[1] / 2**30:.2f} GiB; the knob there is log_prob_max_token_len_per_gpu"
    )
    return cases, notes


@claim("p1-27", GROUP, "E23", "0.6–0.8, 0.9.1 v1")
def world5_tp2() -> Checked:
    """With world_size=5 and TP=2 the run goes on, only with unevenly used GPUs during rollout."""
    five = ("trainer.n_gpus_per_node=5", "data.train_batch_size=10", f"{A}.ppo_mini_batch_size=10")
    cases, notes = [], []
    for v in (LEGACY, V1):
        err = first_error(v, *five)
        cases.append(Case("5 GPUs with TP=2 run", True, err is None, v))
        notes.append(f"[{v}] {err[0]} at {err[1]}: {err[2]}" if err else f"[{v}] runs")
    return cases, notes


def _accepted(override: str) -> tuple[bool, str]:
    try:
        config(LEGACY, override)
        return True, "accepted"
    except ConfigError as exc:
        return False, str(exc)


@claim("p1-28", GROUP, "F11", "all versions")
def config_prefix_override() -> Checked:
    """When generation does not return 720 rows, pass --config.actor_rollout_ref.rollout.n=12 to the launch
    command, because the YAML value may be overridden."""
    ok, why = _accepted("--config.actor_rollout_ref.rollout.n=12")
    plain, _ = _accepted(f"{R}.n=12")
    cases = [Case("--config.actor_rollout_ref.rollout.n=12 is accepted", True, ok)]
    return cases, [
        message("F11", override="--config.actor_rollout_ref.rollout.n=12", outcome=why),
        message("F11", override=f"{R}.n=12", outcome="accepted" if plain else "rejected"),
    ]


@claim("p1-29", GROUP, "F11", "all versions")
def prints_with_v() -> Checked:
    """Every normalisation step prints its values from the worker's __init__; run with -v to see them."""
    ok, why = _accepted("-v")
    printed = [c for c, e in catalogue().items() if e.when == "notice" and "ActorRolloutRefWorker.__init__" in e.where]
    cases = [
        Case("-v is an option of the trainer's command line", True, ok),
        Case("notices verl prints about the normalised sizes at worker init", "some", printed or "none"),
    ]
    return cases, [
        message("F11", override="-v", outcome=why),
        "what the worker init checks, it asserts: "
        + ", ".join(
            c
            for c, e in catalogue().items()
            if "ActorRolloutRefWorker.__init__" in e.where and e.exc_type == "AssertionError"
        ),
    ]
