"""Claims of the second post about the update's counts: optimizer steps per batch, the per-GPU micro-batch key,
the gradient accumulation formula, and what ppo_mini_batch_size and the micro size count (claims p2-10 to p2-13).
"""

from __future__ import annotations

from labkit.ui.seed_claims.probe import LEGACY, REF, V0, V1, A, R, first_error, micro_rows, report, trace
from labkit.ui.seed_claims.record import Case, Checked, claim

GROUP = "mini-batches, micro-batches and gradient accumulation (post 2)"


@claim("p2-10", GROUP, "S1", "0.6–0.8, 0.9.1 v0, 0.9.1 v1")
def updates_per_batch() -> Checked:
    """One batch of experience gives train_batch_size // ppo_mini_batch_size updates."""
    cases = []
    for v in (LEGACY, V1):
        steps = trace(v, f"{A}.ppo_mini_batch_size=20").summary["optimizer_steps_per_step"]
        cases.append(Case("M=20: optimizer steps", 60 // 20, steps, v))
        two = trace(v, f"{A}.ppo_mini_batch_size=20", f"{A}.ppo_epochs=2").summary["optimizer_steps_per_step"]
        cases.append(Case("M=20, ppo_epochs=2: optimizer steps", 60 // 20, two, v, caveat=True))
    m25 = (f"{A}.ppo_mini_batch_size=25", f"{A}.ppo_micro_batch_size_per_gpu=5")
    err = first_error(V0, *m25)
    cases.append(
        Case(
            "M=25 (60 % 25 ≠ 0): optimizer steps",
            60 // 25,
            trace(LEGACY, *m25).summary["optimizer_steps_per_step"],
            LEGACY,
            caveat=True,
        )
    )
    cases.append(
        Case("M=25 (60 % 25 ≠ 0): optimizer steps", 60 // 25, f"{err[0]}: {err[2]}" if err else "runs", V0, caveat=True)
    )
    return cases, [f"[{LEGACY}] M=25: mini-batches per GPU {trace(LEGACY, *m25).summary['mini_batches']}"]


@claim("p2-11", GROUP, "E6", "0.6–0.8, 0.9.1 v1")
def per_gpu_micro_key() -> Checked:
    """ppo_micro_batch_size_per_gpu sets the micro-batch of one GPU directly; the global ppo_micro_batch_size
    is deprecated."""
    cases, notes = [], []
    for v in (LEGACY, V1):
        cases.append(
            Case(
                "rows per update micro-batch with ppo_micro_batch_size_per_gpu=8",
                8,
                micro_rows(trace(v), "update_actor")[0],
                v,
            )
        )
        both = first_error(v, f"{A}.ppo_micro_batch_size=48")
        cases.append(Case("setting both keys: verl calls the global one deprecated", True, "deprecated" in both[2], v))
        dep = report(v, f"~{A}.ppo_micro_batch_size_per_gpu", f"{A}.ppo_micro_batch_size=48")
        notes.append(f"[{v}] only the deprecated key: " + (", ".join(f.code for f in dep.findings) or "no finding"))
    return cases, notes


@claim("p2-12", GROUP, "GA", "0.6–0.8, 0.9.1 v1")
def ga_formula() -> Checked:
    """Gradient accumulation steps = ppo_mini_batch_size · n · sp // world_size // ppo_micro_batch_size_per_gpu."""
    configs = [  # (B = M, n, W, sp, micro)
        (60, 12, 6, 1, 8),
        (64, 12, 8, 2, 8),
        (32, 4, 8, 1, 4),
        (16, 8, 8, 4, 2),
    ]
    cases = []
    for v in (LEGACY, V1):
        seen, want = [], []
        for M, n, W, sp, m in configs:
            over = (
                f"data.train_batch_size={M}",
                f"{A}.ppo_mini_batch_size={M}",
                f"{R}.n={n}",
                f"trainer.n_gpus_per_node={W}",
                f"{A}.ulysses_sequence_parallel_size={sp}",
                f"{REF}.ulysses_sequence_parallel_size={sp}",
                f"{A}.ppo_micro_batch_size_per_gpu={m}",
                f"{R}.log_prob_micro_batch_size_per_gpu={m}",
                f"{REF}.log_prob_micro_batch_size_per_gpu={m}",
                f"{R}.tensor_model_parallel_size=1",
            )
            seen.append(trace(v, *over).at("update_actor")[0].extra["ga_per_mini"][0])
            want.append(M * n * sp // W // m)
        cases.append(Case("GA for (M, n, W, sp, micro) in " + str(configs), want, seen, v))
    return cases


@claim("p2-13", GROUP, "E20", "0.6–0.8, 0.9.1 v1")
def mini_counts_prompts() -> Checked:
    """ppo_mini_batch_size counts prompts over all GPUs; ppo_micro_batch_size_per_gpu counts prompt+response rows
    on one GPU."""
    m4 = (
        f"{A}.ppo_micro_batch_size_per_gpu=4",
        f"{R}.log_prob_micro_batch_size_per_gpu=4",
        f"{REF}.log_prob_micro_batch_size_per_gpu=4",
    )
    cases = []
    for v in (LEGACY, V1):
        base = trace(v, *m4).at("update_actor")[0]
        n6 = trace(v, *m4, f"{R}.n=6").at("update_actor")[0]
        w12 = trace(v, *m4, "trainer.n_gpus_per_node=12").at("update_actor")[0]
        cases.append(
            Case("mini rows per GPU: n=12 vs n=6 (×n: prompts)", 2, base.mini_batches[0] / n6.mini_batches[0], v)
        )
        cases.append(
            Case("mini rows per GPU: 6 vs 12 GPUs (global: ÷W)", 2, base.mini_batches[0] / w12.mini_batches[0], v)
        )
        cases.append(
            Case(
                "micro rows with n=6 / 12 GPUs (per GPU, unchanged)",
                (4, 4),
                (n6.micro_batches[0].rows, w12.micro_batches[0].rows),
                v,
            )
        )
    return cases
