"""The batch rules of verl 0.9.1's default trainer loop (``trainer.use_v1=true``, ``verl/trainer/ppo/v1``), each
written once: which loop a config runs, the agent-loop split of the prompts, the required batch multiple and the
synthetic padding rows, and TransferQueue's uneven dispatch chunks. Pure arithmetic on verl's quantities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

LOOPS = ("legacy", "v0", "v1")
SYNTHETIC_PADDING_SEQ_LEN = 128
"""Tokens of one synthetic padding row (verl/trainer/ppo/padding_utils.py: SYNTHETIC_PADDING_SEQ_LEN)."""
PADDING_PROMPT_LEN, PADDING_RESPONSE_LEN = SYNTHETIC_PADDING_SEQ_LEN - 1, 1
"""A padding row is 127 eos prompt tokens and 1 eos response token, with response/loss mask 0."""
LOOP_TITLES = {
    "legacy": "legacy workers, RayPPOTrainer loop (verl <= 0.7)",
    "v0": "engine workers, v0 RayPPOTrainer loop (verl 0.9.1, trainer.use_v1=false)",
    "v1": "engine workers, v1 PPOTrainer loop (verl 0.9.1, trainer.use_v1=true, the default)",
}


def loop_of(profile: str, use_v1: bool | None) -> str:
    """The trainer loop a config runs: ``legacy`` (profile legacy), else ``v1`` when ``trainer.use_v1`` (0.9.1's
    default), else ``v0``. Mirrors verl/trainer/main_ppo.py: main (the only switch is trainer.use_v1)."""
    if profile == "legacy":
        return "legacy"
    return "v1" if use_v1 else "v0"


def agent_loop_split(prompts: int, workers: int) -> list[int]:
    """Prompts per agent-loop worker: ``TensorDict.chunk(workers)`` on the B prompts, torch.chunk's rule (pieces of
    ⌈B/A⌉, the last one shorter, fewer than A pieces when B is small). 60 over 8 → 8,8,8,8,8,8,8,4.
    Mirrors verl/trainer/ppo/v1/agent_loop_tq.py: AgentLoopManagerTQ.generate_sequences."""
    if prompts <= 0 or workers <= 0:
        return []
    size = -(-prompts // workers)
    full, rest = divmod(prompts, size)
    return [size] * full + ([rest] if rest else [])


def actor_updates_at(critic_warmup: int, global_steps: int) -> bool:
    """Whether the actor updates at this global step (both loops): ``critic_warmup <= global_steps``.
    Mirrors PPOTrainer._step_once (v1) and RayPPOTrainer.fit (v0)."""
    return critic_warmup <= global_steps


def first_update_step(critic_warmup: int, last_step: int | None) -> int | None:
    """The first step with an actor update when it is not step 1 and verl reaches it by ``last_step`` (None: any
    step); None otherwise (step 1 already updates, or the run stops before it)."""
    if critic_warmup <= 1 or (last_step is not None and last_step < critic_warmup):
        return None
    return critic_warmup


def required_batch_multiple(
    dp_size: int,
    rollout_n: int,
    actor_mini_batch_size: int,
    critic_mini_batch_size: int | None,
    critic_warmup: int,
    global_steps: int = 1,
) -> int:
    """lcm(D, critic M·n when a critic is used, actor M·n when the actor updates at this step (critic_warmup <=
    global_steps)). Mirrors verl/trainer/ppo/v1/trainer_base.py: PPOTrainer._get_required_batch_multiple."""
    multiple = dp_size
    if critic_mini_batch_size is not None:
        multiple = math.lcm(multiple, critic_mini_batch_size * rollout_n)
    if actor_updates_at(critic_warmup, global_steps):
        multiple = math.lcm(multiple, actor_mini_batch_size * rollout_n)
    return multiple


def padding_rows(rows: int, multiple: int) -> int:
    """Synthetic rows appended so ``rows`` becomes a multiple: 0 to multiple − 1.
    Mirrors verl/trainer/ppo/padding_utils.py: upsample_batch_to_divisible_size."""
    return -rows % multiple if multiple > 0 else 0


def batch_meta_chunks(rows: int, chunks: int) -> list[int]:
    """Rows per DP chunk of TransferQueue's ``BatchMeta.chunk``: consecutive slices, the first rows % k one row
    longer (uneven allowed, no error). Mirrors transfer_queue/metadata.py: BatchMeta.chunk / KVBatchMeta.chunk."""
    base, extra = divmod(rows, chunks)
    return [base + (1 if i < extra else 0) for i in range(chunks)]


def completion_keys(prompt_sessions: Sequence[int]) -> list[tuple[int, int]]:
    """(prompt, session) of every trajectory in submission order: prompt-major, sessions 0..n−1; v1 keys them
    ``{uid}_{session}_0``. The replay buffer returns them in the order they were registered (completion order)."""
    return [(p, s) for p, n in enumerate(prompt_sessions) for s in range(n)]
