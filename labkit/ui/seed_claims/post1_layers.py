"""Claims of the first post about its four batch layers: the worked example's numbers, the stages the samples
feed, generation's shapes, the mini-batch normalisation and gradient accumulation (claims p1-01 to p1-07). Each check
plans the example (60 prompts, n=12, 6 GPUs, rollout TP=2, mini 60, micro 8) or a variant with labkit.
"""

from __future__ import annotations

from labkit.config.messages import ConfigError
from labkit.protocol.fields import ROLLOUT_OUTPUT_KEYS
from labkit.rules.catalogue import message
from labkit.ui.seed_claims.probe import (
    LEGACY,
    M30,
    V1,
    A,
    R,
    config,
    error_text,
    micro_rows,
    per_rank,
    report,
    startup_codes,
    trace,
)
from labkit.ui.seed_claims.record import Case, Checked, claim

GROUP = "the four layers: numbers and normalisation (post 1)"
BOTH = (LEGACY, V1)
KL = (f"{A}.use_kl_loss=true",)


@claim("p1-01", GROUP, "E20", "0.6–0.8, 0.9.1 v1")
def layers_chain() -> Checked:
    """A step is a chain of four batch layers: 60 prompts (train_batch_size) become 60 × 12 = 720 samples, each
    GPU updates on a normalised mini-batch of 120 rows, and log-probs run in micro-batches of 8 rows."""
    cases = []
    for v in BOTH:
        tr = trace(v)
        upd = tr.at("update_actor")[0]
        seen = (tr.summary["B"], tr.summary["samples"], upd.mini_batches[0], micro_rows(tr, "old_log_prob")[0])
        cases.append(Case("prompts, samples, mini-batch rows per GPU, log-prob micro rows", (60, 720, 120, 8), seen, v))
    return cases


@claim("p1-02", GROUP, "E1", "0.6–0.8, 0.9.1 v1")
def batch_divisible_by_gpus() -> Checked:
    """data.train_batch_size must be a multiple of trainer.n_gpus_per_node, or verl refuses the config."""
    cases, small = [], (f"{A}.ppo_mini_batch_size=3", f"{A}.ppo_micro_batch_size_per_gpu=1")
    for v in BOTH:
        for b, n in ((3, 2), (7, 1)):
            over = (f"data.train_batch_size={b}", f"{R}.n={n}", *small)
            rejected = bool(startup_codes(v, *over))
            cases.append(Case(f"B={b}, n={n} on 6 GPUs ({b} % 6 ≠ 0) rejected at start-up", True, rejected, v))
    dyn = startup_codes(LEGACY, "data.train_batch_size=7", f"{R}.n=1", *small, f"{A}.use_dynamic_bsz=true")
    notes = [
        "the start-up check is (B·n) % W: "
        + report(LEGACY, "data.train_batch_size=7", f"{R}.n=1", *small).errors[0].message,
        f"with use_dynamic_bsz=true, B=7, n=1 passes start-up: start-up errors {dyn or 'none'}",
    ]
    return cases, notes


@claim("p1-03", GROUP, "F1", "0.6–0.8, 0.9.1 v1")
def samples_feed_every_stage() -> Checked:
    """The 720 samples are the input of old log-probs, reference log-probs, reward and advantage."""
    cases = []
    for v in BOTH:
        tr = trace(v, *KL)
        seen = (
            sum(per_rank(tr, "old_log_prob")),
            sum(per_rank(tr, "ref_log_prob")),
            tr.stage("reward").global_rows,
            tr.stage("advantage").global_rows,
        )
        cases.append(Case("rows at old_log_prob, ref_log_prob, reward, advantage", (720,) * 4, seen, v))
    return cases, [message("F1", stages=" → ".join(trace(LEGACY, *KL).stage_names()))]


@claim("p1-04", GROUP, "F2", "0.6–0.8, 0.9.1 v1")
def generate_shapes_and_keys() -> Checked:
    """generate_sequences takes a [60, 8192] batch of prompts and returns 720 rows, the completions under the key
    prompt_token_ids."""
    cases = []
    for v in BOTH:
        tr = trace(v)
        cases.append(Case("rows the generation call receives", 60, tr.stage("agent_loop").global_rows, v))
        cases.append(Case("rows it returns", 720, tr.stage("generate").global_rows, v))
    cases.append(Case("output fields include prompt_token_ids", True, "prompt_token_ids" in ROLLOUT_OUTPUT_KEYS))
    tr = trace(LEGACY)
    notes = [
        message(
            "F2",
            rows=720,
            workers=8,
            per_worker=tr.summary["agent_loop"]["per_worker"],
            replicas=3,
            fields=", ".join(ROLLOUT_OUTPUT_KEYS),
        ),
        f"the row width is prompt_length + response_length = {tr.summary['width']} here, not a fixed 8192",
    ]
    return cases, notes


@claim("p1-05", GROUP, "E20", "0.6–0.8, 0.9.1 v1")
def normalisation_code() -> Checked:
    """The worker normalises the mini-batch as ppo_mini_batch_size *= n, then //= world_size // sp: 60 → 720 → 120,
    a floor division that never complains."""
    cases = []
    for v in BOTH:
        cases.append(
            Case(
                "seed example: mini-batch rows per GPU",
                60 * 12 // (6 // 1),
                trace(v).at("update_actor")[0].mini_batches[0],
                v,
            )
        )
        err = error_text(v, *M30)
        seen = err if err else trace(v, *M30).at("update_actor")[0].mini_batches[0]
        cases.append(Case("M=30, n=1 on 8 GPUs: (30·1)//8 rows, no error", 30 * 1 // 8, seen, v))
    return cases, [trace(LEGACY).summary["update"]["update_actor"]["mini_formula"]]


@claim("p1-06", GROUP, "E20", "0.6–0.8, 0.9.1 v1")
def mini_is_the_optimizer_batch() -> Checked:
    """Each GPU runs forward and backward over these 120 rows in the actor update: they are one optimizer.step's
    batch."""
    cases = []
    for v in BOTH:
        upd = trace(v).at("update_actor")
        seen = (sorted({r.rows for r in upd}), upd[0].mini_batches, upd[0].extra["optimizer_steps"])
        cases.append(Case("rows per GPU, mini-batches per GPU, optimizer steps", ([120], [120], 1), seen, v))
    return cases


@claim("p1-07", GROUP, "GA", "0.6–0.8")
def ga_from_a_setting() -> Checked:
    """The 120 rows set the gradient accumulation through a gradient_accumulation_steps setting: with more than one
    accumulation step, 120 is the batch after accumulating."""
    key = f"{A}.gradient_accumulation_steps"
    try:
        config(LEGACY, f"{key}=2")
        exists, why = True, "accepted"
    except ConfigError as exc:
        exists, why = False, str(exc)
    s = trace(LEGACY).summary
    cases = [
        Case(f"verl has a key {key}", True, exists),
        Case("GA × micro rows = the 120 rows of the mini-batch", 120, s["ga"] * 8),
    ]
    return cases, [why, message("GA", mini=s["mini_normalized"], micro=8, ga=s["ga"])]
