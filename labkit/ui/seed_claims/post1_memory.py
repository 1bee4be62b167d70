"""Claims of the first post about what the mini-batch decides (memory, gradient traffic, optimizer steps), the
rollout.n=13 example, and the log-prob micro-batch (claims p1-08 to p1-17). Memory figures come from labkit's memory
model for Qwen2.5-7B on an 80 GB H100 (docs/memory.md).
"""

from __future__ import annotations

from labkit.config.keys import ARR
from labkit.memory.gpus import gpu
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import step_phases
from labkit.memory.verdict import memory_report
from labkit.rules.catalogue import message
from labkit.ui.seed_claims.probe import (
    LEGACY,
    M30,
    REF,
    V1,
    A,
    R,
    config,
    error_text,
    first_error,
    micro_rows,
    per_rank,
    trace,
)
from labkit.ui.seed_claims.record import Case, Checked, claim

GROUP = "what the mini-batch decides, and the log-prob micro-batch (post 1)"
BOTH = (LEGACY, V1)
MODEL, GPU = "Qwen2.5-7B", "H100-80GB"


def _gib(n: int) -> float:
    return round(n / 2**30, 2)


def _phase(version: str, *overrides: str, phase: str):
    cfg = config(version, *overrides)
    return step_phases(cfg, MemorySettings.from_config(cfg, MODEL, gpu(GPU).memory_bytes))[phase]


@claim("p1-08", GROUP, "F12", "0.6–0.8, 0.9.1 v1")
def mini_sets_activation_peak() -> Checked:
    """The 120 rows set the peak activation memory of the update."""
    cases, notes = [], []
    for v in BOTH:
        big = _phase(v, phase="update_actor")
        small = _phase(v, f"{A}.ppo_mini_batch_size=20", phase="update_actor")  # 40 rows per GPU, GA 5
        cases.append(
            Case(
                "update peak differs between 120 and 40 rows per GPU (micro 8)",
                True,
                big.peak_bytes != small.peak_bytes,
                v,
            )
        )
    micro4 = _phase(LEGACY, f"{A}.ppo_micro_batch_size_per_gpu=4", phase="update_actor")
    big = _phase(LEGACY, phase="update_actor")
    notes.append(
        f"{MODEL} on {GPU}: "
        + message("F12", phase="update_actor", peak_gib=_gib(big.peak_bytes), instant=big.peak_instant, terms=_top(big))
    )
    notes.append(f"micro 8 → 4 rows: update peak {_gib(big.peak_bytes)} → {_gib(micro4.peak_bytes)} GiB")
    return cases, notes


def _top(phase, k: int = 3) -> str:
    top = sorted(phase.terms.items(), key=lambda kv: -kv[1])[:k]
    return ", ".join(f"{name} {_gib(b)} GiB" for name, b in top)


@claim("p1-09", GROUP, "F8", "0.6–0.8, 0.9.1 v1")
def mini_sets_gradient_traffic() -> Checked:
    """The 120 rows set the communication volume: the size of the gradient all-reduce."""
    cases, notes = [], []
    for v in BOTH:
        big = _phase(v, phase="update_actor").terms["grads"]
        small = _phase(v, f"{A}.ppo_mini_batch_size=20", phase="update_actor").terms["grads"]
        cases.append(Case("gradient bytes per GPU differ between 120 and 40 rows per GPU", True, big != small, v))
        for m in (60, 20):
            upd = trace(v, f"{A}.ppo_mini_batch_size={m}").at("update_actor")[0]
            count = upd.collectives.get("reduce_scatter(grads)", 0)
            notes.append(f"[{v}] M={m}: " + message("F8", role="update_actor", count=count))
    notes.append(f"the gradient shard is parameter-sized: {_gib(big)} GiB per GPU for {MODEL} over 6 GPUs")
    return cases, notes


@claim("p1-10", GROUP, "S1", "0.6–0.8, 0.9.1 v1")
def mini_value_does_not_matter() -> Checked:
    """The configured ppo_mini_batch_size does not matter in itself; what matters is that M × n divides by the
    GPU count, and an assert fires when it does not."""
    cases = []
    for v in BOTH:
        steps = [trace(v, f"{A}.ppo_mini_batch_size={m}").summary["optimizer_steps_per_step"] for m in (60, 20)]
        cases.append(
            Case(
                "optimizer steps per step with M=60 and with M=20",
                "equal",
                "equal" if steps[0] == steps[1] else f"{steps[0]} vs {steps[1]}",
                v,
            )
        )
        cases.append(Case("M=30, n=1 on 8 GPUs (30 % 8 ≠ 0) raises", True, first_error(v, *M30) is not None, v))
    return cases, [f"[{LEGACY}] M=30 on 8 GPUs: mini-batches per GPU {trace(LEGACY, *M30).summary['mini_batches']}"]


@claim("p1-11", GROUP, "E21", "0.6–0.8, 0.9.1 v1")
def n13_not_divisible() -> Checked:
    """With rollout.n=13, 60 × 13 = 780 samples cannot be split over 6 GPUs, so an assert stops the run."""
    s = trace(LEGACY, f"{R}.n=13").summary
    cases = [Case("780 % 6 ≠ 0", True, s["samples"] % s["W"] != 0)]
    for v in BOTH:
        err = first_error(v, f"{R}.n=13")
        cases.append(Case("first error: the B·n % W check (E1)", "E1", err[0] if err else None, v))
    notes = [f"[{v}] first error: {error_text(v, f'{R}.n=13')}" for v in BOTH]
    notes.append(f"[{LEGACY}] with micro 10: {error_text(LEGACY, f'{R}.n=13', f'{A}.ppo_micro_batch_size_per_gpu=10')}")
    return cases, notes


@claim("p1-12", GROUP, "S4", "0.6–0.8, 0.9.1 v1")
def logprob_micro_normalised() -> Checked:
    """log_prob_micro_batch_size_per_gpu=8 is normalised by the 6 GPUs to 8 // 6 = 1 row."""
    cases = [Case("rows per log-prob micro-batch", 8 // 6, micro_rows(trace(v), "old_log_prob")[0], v) for v in BOTH]
    dep = (f"~{R}.log_prob_micro_batch_size_per_gpu", f"{R}.log_prob_micro_batch_size=8")
    rows = micro_rows(trace(LEGACY, *dep), "old_log_prob")[0]
    return cases, [f"[{LEGACY}] the deprecated global log_prob_micro_batch_size=8 gives {rows} row(s) per micro-batch"]


@claim("p1-13", GROUP, "S3", "0.6–0.8, 0.9.1 v1")
def logprob_micro_count() -> Checked:
    """With 8 rows per log-prob micro-batch, the 720 samples make 90 micro-batches, 15 on each GPU."""
    cases = []
    for v in BOTH:
        counts = per_rank(trace(v), "old_log_prob", "n_micro")
        cases.append(Case("micro-batches in all, per GPU", (90, [15]), (sum(counts), sorted(set(counts))), v))
    return cases


@claim("p1-14", GROUP, "F12", "0.6–0.8, 0.9.1 v1")
def logprob_keeps_activations() -> Checked:
    """compute_log_prob is memory-hungry because it keeps every intermediate activation for the KL term later."""
    cases, notes = [], []
    for v in BOTH:
        fwd, upd = _phase(v, phase="old_log_prob"), _phase(v, phase="update_actor")
        kept = fwd.terms.get("activations", 0) >= upd.terms.get("activations", 0)
        cases.append(Case("log-prob pass holds the activations a training forward keeps (8 rows each)", True, kept, v))
        notes.append(
            f"[{v}] activations: old_log_prob {_gib(fwd.terms.get('activations', 0))} GiB, "
            f"update_actor {_gib(upd.terms.get('activations', 0))} GiB"
        )
    fwd = _phase(LEGACY, phase="old_log_prob")
    notes.append(
        message("F12", phase="old_log_prob", peak_gib=_gib(fwd.peak_bytes), instant=fwd.peak_instant, terms=_top(fwd))
    )
    return cases, notes


@claim("p1-15", GROUP, "S3", "0.6–0.8, 0.9.1 v1")
def logprob_micro_one() -> Checked:
    """With 1 row per log-prob micro-batch there are 720 micro-batches and more communication."""
    cases = []
    for v in BOTH:
        one, eight = trace(v, f"{R}.log_prob_micro_batch_size_per_gpu=1"), trace(v)
        gathers = [t.at("old_log_prob")[0].collectives.get("all_gather(params)", 0) for t in (one, eight)]
        cases.append(Case("micro-batches in all", 720, sum(per_rank(one, "old_log_prob", "n_micro")), v))
        cases.append(Case("more FSDP all-gathers per GPU than with 8 rows", True, gathers[0] > gathers[1], v))
    return cases


@claim("p1-16", GROUP, "S3", "0.6–0.8, 0.9.1 v1")
def logprob_micro_720() -> Checked:
    """With 720 rows per log-prob micro-batch one GPU would load all 720 samples at once."""
    cases = []
    for v in BOTH:
        over = f"{R}.log_prob_micro_batch_size_per_gpu=720"
        err = error_text(v, over)
        seen = err if err else max(m for r in range(6) for m in micro_rows(trace(v, over), "old_log_prob", r))
        cases.append(Case("rows in the largest log-prob micro-batch", 720, seen, v))
    return cases


@claim("p1-17", GROUP, "F12", "0.6–0.8, 0.9.1 v1")
def only_oom_knob() -> Checked:
    """log_prob_micro_batch_size_per_gpu is the only knob that cures an out-of-memory error in compute_log_prob
    without changing the model or the number of GPUs."""
    over = (
        "data.max_prompt_length=1024",
        "data.max_response_length=8192",
        f"{ARR}.model.use_remove_padding=false",
        f"{R}.log_prob_micro_batch_size_per_gpu=32",
        f"{REF}.log_prob_micro_batch_size_per_gpu=32",
    )
    cases, notes = [], []
    for v in BOTH:
        cfg = config(v, *over)
        rep = memory_report(cfg, MemorySettings.from_config(cfg, MODEL, gpu(GPU).memory_bytes))
        knobs = sorted({f["knob"] for f in rep.fixes if f["fits"] and f["phase"] == "old_log_prob"})
        cases.append(
            Case("knobs that make the OOMing log-prob phase fit", [f"{R}.log_prob_micro_batch_size_per_gpu"], knobs, v)
        )
        notes.append(f"[{v}] {MODEL}, 1k+8k tokens, 32 rows per micro-batch: first OOM in {rep.first_oom}")
    return cases, notes
