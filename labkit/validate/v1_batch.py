"""The v1 loop's batch at step 1, as rules: the dataloader fetches (E47, ``PPOTrainer._next_train_batch``), the
padding to a multiple of lcm(D, M x n, critic M x n) that verl logs (N6, ``padding_utils.
upsample_batch_to_divisible_size``) and the balance flag v1 never reads (S5). Mirrors verl 0.9.1's
``verl/trainer/ppo/v1/trainer_base.py: PPOTrainer._step_once``; ``first_step`` lists them under ``V1``.
"""

from __future__ import annotations

from labkit.rules.catalogue import message
from labkit.validate.rulebook import V1, rule
from labkit.validate.snapshot import NOTICE, SILENT, STEP1, Recorder, Snap, mod
from labkit.validate.step_state import StepState

TRAINER_BASE = "verl/trainer/ppo/v1/trainer_base.py: PPOTrainer"


@rule("E47", when=V1)
def gen_batch_divides_train_batch(rec: Recorder, s: Snap, st: StepState) -> None:
    """The v1 loop collects train_batch_size prompts per step from whole dataloader batches of gen_batch_size."""
    B = s.train_batch_size
    gen = s.gen_batch_size or B
    rec.add(
        B % gen != 0,
        "E47",
        "ValueError",
        message("E47", num_prompts=B, gen_batch_size=gen),
        STEP1,
        f"{TRAINER_BASE}._next_train_batch",
        [f"data.train_batch_size = {B}", f"data.gen_batch_size = {gen}", mod(B, gen)],
        "The v1 loop collects train_batch_size prompts per step from whole dataloader batches of gen_batch_size.",
        role="trainer",
    )


@rule("N6", when=V1)
def padded_to_multiple(rec: Recorder, s: Snap, st: StepState) -> None:
    """verl's upsampling log line: the synthetic rows it appends so the batch divides by D and every mini-batch."""
    geo, D = s.geo, st.D
    X, L, pad = geo.generated_samples, geo.required_multiple, geo.padding_rows
    terms = [f"D = {D}"]
    if s.need_critic:
        terms.append(f"critic M x n = {s.critic_ppo_mini_batch_size} x {s.rollout_n}")
    if geo.actor_updates:  # the actor updates at this step
        terms.append(f"M x n = {s.ppo_mini_batch_size} x {s.rollout_n}")
    rec.add(
        pad > 0,
        "N6",
        None,
        message("N6", rows=X, padded=X + pad, pad=pad, multiple=L),
        STEP1,
        "verl/trainer/ppo/padding_utils.py: upsample_batch_to_divisible_size",
        [
            f"B x n = {s.train_batch_size} x {s.rollout_n} = {X}",
            f"required multiple = lcm({', '.join(terms)}) = {L}",
            f"pad = -{X} % {L} = {pad} synthetic rows of 128 tokens",
            f"rows per DP rank = ({X} + {pad}) / {D} = {(X + pad) // D}",
        ],
        "The v1 loop appends synthetic rows (loss mask 0) so the batch divides by D and by every mini-batch; they "
        "still run through every forward and backward pass.",
        NOTICE,
        role="trainer",
    )


@rule("S5", when=V1)
def balance_flag_unread(rec: Recorder, s: Snap, st: StepState) -> None:
    rec.add(
        not s.balance_batch,
        "S5",
        None,
        message("S5"),
        STEP1,
        f"{TRAINER_BASE}._step_once",
        ["trainer.balance_batch = false"],
        "The v1 loop never reads trainer.balance_batch (verl issue #7758): it pads and reorders every step.",
        SILENT,
        role="trainer",
    )


V1_BATCH_RULES = (gen_batch_divides_train_batch, padded_to_multiple, balance_flag_unread)
