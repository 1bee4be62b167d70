"""The tiny synthetic task: puzzles on strings of distinct digits whose answers vary in length, and their rule reward.

A prompt is ``"<op> <digits>="``, e.g. ``"rev 3917="``; the answer is a digit string of 1 to 10 characters
(``"7193"``), ended by the EOS token. Qwen2's pre-tokenizer isolates every digit, so answer lengths in tokens equal
answer lengths in characters and rollouts stop at different lengths. Digits within a prompt are distinct.

Its rule reward (``labkit.rl.reward.compute_score``) mirrors verl's rule rewards: ``score`` (1.0) for the exact
answer, ``format_score`` (0.0 by default) for a well-formed (``DIGITS_RE``) but wrong answer, 0.0 otherwise.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

EOS_TOKEN = "<|endoftext|>"

# op -> (min digits, max digits) of the operand (distinct digits, so at most 10); answer lengths follow from these.
# The set-based ops (sort, desc, miss, max, len) are learnt quickly; rev needs an induction-style lookup and stays
# hard for the tiny model, which leaves room for RL to improve.
OPS: dict[str, tuple[int, int]] = {
    "sort": (1, 10),  # the digits ascending        -> answer length 1..10
    "desc": (1, 10),  # the digits descending       -> answer length 1..10
    "miss": (1, 9),  # the absent digits ascending -> answer length 1..9
    "rev": (1, 10),  # the digits reversed         -> answer length 1..10
    "len": (1, 10),  # how many digits             -> answer length 1..2
    "max": (2, 10),  # the largest digit           -> answer length 1
}
MAX_ANSWER_LEN = 10
_PROMPT_RE = re.compile(r"^(sort|desc|miss|rev|len|max) ([0-9]+)=$")
DIGITS_RE = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class TinyExample:
    """One task instance: the prompt text and its reference answer (without EOS)."""

    op: str
    prompt: str
    answer: str


def solve(op: str, digits: str) -> str:
    """The reference answer of one op on a digit string."""
    if op == "sort":
        return "".join(sorted(digits))
    if op == "desc":
        return "".join(sorted(digits, reverse=True))
    if op == "miss":
        return "".join(c for c in "0123456789" if c not in digits)
    if op == "rev":
        return digits[::-1]
    if op == "len":
        return str(len(digits))
    if op == "max":
        return max(digits)
    raise ValueError(f"unknown op {op!r}; expected one of {sorted(OPS)}")


def sample_example(rng: random.Random, op: str | None = None) -> TinyExample:
    """Draw one example: op uniform over OPS unless given, length uniform in its range, distinct digits."""
    op = op if op is not None else rng.choice(sorted(OPS))
    lo, hi = OPS[op]
    digits = "".join(rng.sample("0123456789", rng.randint(lo, hi)))
    return TinyExample(op, f"{op} {digits}=", solve(op, digits))


def make_examples(n: int, seed: int) -> list[TinyExample]:
    """n examples, reproducible from the seed (independent of any global RNG state)."""
    rng = random.Random(seed)
    return [sample_example(rng) for _ in range(n)]


def reference_answer(prompt: str) -> str:
    """Parse a prompt text (possibly with left padding / special tokens around it) and return its answer."""
    text = prompt.replace(EOS_TOKEN, "").strip()
    m = _PROMPT_RE.match(text)
    if m is None:
        raise ValueError(f"not a tiny-task prompt: {prompt!r}")
    op, digits = m.group(1), m.group(2)
    return solve(op, digits)


def extract_answer(response: str) -> str:
    """The response up to its first EOS token (everything after EOS, e.g. padding, is ignored)."""
    return response.split(EOS_TOKEN, 1)[0]
