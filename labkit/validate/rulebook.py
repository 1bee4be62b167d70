"""The rule record every validate stage iterates over: one check verl performs, the codes it records, the profiles,
engines and loops it applies to (``When``), and the function that records it on a ``Recorder``.

A stage (``startup``, ``worker_init``, ``first_step``) is an ordered tuple of rules, in verl's own order;
``run_rules`` runs the ones that apply and stops where a rule returns True (verl raised and runs nothing after it).
What one rule hands the next (worker init's normalised sizes, step 1's DP sizes) is the stage's explicit state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from labkit.validate.snapshot import Recorder, Snap


@dataclass(frozen=True)
class When:
    """A named condition on the snapshot: which profiles, engines, loops, roles or switches a rule applies to.
    ``&``, ``|`` and ``~`` combine conditions (their names too, for reading a rule list)."""

    name: str
    test: Callable[[Snap], bool]

    def __call__(self, s: Snap) -> bool:
        return bool(self.test(s))

    def __and__(self, other: When) -> When:
        return When(f"{self.name} & {other.name}", lambda s: self(s) and other(s))

    def __or__(self, other: When) -> When:
        return When(f"({self.name} | {other.name})", lambda s: self(s) or other(s))

    def __invert__(self) -> When:
        return When(f"~{self.name}", lambda s: not self(s))


ALWAYS = When("always", lambda s: True)
LEGACY = When("legacy", lambda s: s.legacy)
"""verl 0.7.1's workers (``fsdp_workers.py`` / ``megatron_workers.py``)."""
ENGINE = When("engine", lambda s: not s.legacy)
"""verl 0.9.1's engine workers (``engine_workers.py``)."""
MEGATRON = When("megatron", lambda s: s.megatron)
FSDP = When("fsdp", lambda s: not s.megatron)
V1 = When("v1", lambda s: s.geo.loop == "v1")
"""verl 0.9.1's default v1 loop (``trainer/ppo/v1``); the others are v0 (``RayPPOTrainer``) or legacy."""
STATIC = When("static", lambda s: not s.use_dynamic_bsz)
"""The actor's micro-batching is static (``actor.use_dynamic_bsz`` false)."""
REF = When("ref", lambda s: s.need_ref)
"""verl builds the reference policy (a KL loss or an in-reward KL)."""
CRITIC = When("critic", lambda s: s.need_critic)
"""verl builds the critic."""
REF_ENGINE = When("ref engine", lambda s: s.need_ref and not s.lora_rank)
"""0.9.1 builds a reference engine of its own (with LoRA the actor without its adapter serves as the ref)."""
ACTOR_UPDATES = When("actor update", lambda s: s.geo.actor_updates)
"""The actor is updated at this step (``trainer.critic_warmup`` reached)."""
CRITIC_STATIC = When("critic static", lambda s: not s.critic_use_dynamic_bsz)


@dataclass(frozen=True)
class Rule:
    """One check verl performs: ``check(rec, s, *state)`` records its finding(s) (message from the catalogue, where
    verl raises it, the arithmetic) and returns True when verl stops there; ``when`` says where it applies."""

    code: str
    """The code(s) it records (docs/errors.md), e.g. ``"E9"`` or ``"X4 E41 E42"``."""
    check: Callable[..., bool | None]
    when: When = ALWAYS

    def applies(self, s: Snap) -> bool:
        """The rule runs for this snapshot's profile, engine, loop and roles."""
        return self.when(s)

    def __call__(self, rec: Recorder, s: Snap, *state: Any) -> bool:
        return bool(self.check(rec, s, *state))


def rule(code: str, when: When = ALWAYS) -> Callable[[Callable[..., bool | None]], Rule]:
    """Decorator: the function becomes a ``Rule`` recording ``code`` where ``when`` holds."""

    def wrap(check: Callable[..., bool | None]) -> Rule:
        return Rule(code, check, when)

    return wrap


def run_rules(rules: Sequence[Rule], rec: Recorder, s: Snap, *state: Any) -> bool:
    """Run, in order, the rules that apply to ``s``; True when one stopped the stage (the rest did not run)."""
    for r in rules:
        if r.applies(s) and r(rec, s, *state):
            return True
    return False
