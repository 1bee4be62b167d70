"""The deprecated global micro size and its per-GPU twin: at least one set, not both (E3/E4, E6/E7, E13/E14).

Mirrors ``verl/utils/config.py: validate_config.check_mutually_exclusive`` and the ``ActorConfig`` /
``CriticConfig._check_mutually_exclusive`` it triggers; start-up runs it for the actor, the rollout's and the ref's
log-prob keys and the critic, and 0.9.1's engine worker again for the ref (renamed to an ``ActorConfig``).
"""

from __future__ import annotations

from labkit.validate.snapshot import AE, STARTUP, VE, Recorder


def mutual(
    rec: Recorder,
    name: str,
    dep: int | None,
    per_gpu: int | None,
    where: str,
    kind: str,
    role: str,
    when: str = STARTUP,
) -> None:
    """validate_config.check_mutually_exclusive / *Config._check_mutually_exclusive: E3/E4, E6/E7, E13/E14."""
    sec = {"lp": name, "actor": "actor", "critic": "critic"}[kind]
    param = {"lp": "log_prob_micro_batch_size", "actor": "ppo_micro_batch_size", "critic": "micro_batch_size"}[kind]
    codes = {"lp": ("E3", "E4"), "actor": ("E7", "E6"), "critic": ("E13", "E14")}[kind]
    arith = [f"{sec}.{param} = {dep}", f"{sec}.{param}_per_gpu = {per_gpu}"]
    tail = " if use_dynamic_bsz is not enabled." if kind == "actor" else "."
    rec.add(
        dep is None and per_gpu is None,
        codes[0],
        AE if kind == "actor" else VE,
        f"[{sec}] Please set at least one of '{sec}.{param}' or '{sec}.{param}_per_gpu'{tail}",
        when,
        where,
        arith,
        f"Static micro-batching needs a micro-batch size for {name}; neither key is set.",
        role=role,
    )
    rec.add(
        dep is not None and per_gpu is not None,
        codes[1],
        VE,
        f"[{sec}] You have set both '{sec}.{param}' AND '{sec}.{param}_per_gpu'. Please remove '{sec}.{param}' "
        f"because only '*_{param}_per_gpu' is supported (the former is deprecated).",
        when,
        where,
        arith,
        "The deprecated global key and its per-GPU replacement are mutually exclusive."
        + (
            " critic.ppo_micro_batch_size_per_gpu interpolates from critic.ppo_micro_batch_size, so setting only"
            " the deprecated key also trips this."
            if kind == "critic"
            else ""
        ),
        role=role,
    )
