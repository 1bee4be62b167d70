"""The claims of the two blog posts that inspired the lab, each checked by running labkit (notebook 09).

``record`` holds the claim record, its cases and the verdict rule; ``probe`` the memoised configs, plans and
reports of the posts' worked example; the claims live in one module per topic. The first post: ``post1_layers``
(the four layers' numbers, normalisation), ``post1_memory`` (what the mini-batch decides, the log-prob micro-batch),
``post1_rollout`` (rollout, per-card table, errors and tips). The second: ``post2_dispatch`` (from the step to one
GPU), ``post2_counts`` (mini-batches, micro-batches, gradient accumulation), ``post2_static`` (the two paths, static
micro-batches), ``post2_dynamic`` (dynamic micro-batches), ``post2_balance`` (``_balance_batch``), ``post2_forward``
(the forward and update passes), ``post2_params`` (parameter table, edge cases, the 8-sample example, advice).
``results()`` runs the checks; ``table`` renders them.
"""

from __future__ import annotations

from collections.abc import Iterable

from labkit.ui.seed_claims import (  # noqa: F401 - importing a module registers its claims
    post1_layers,
    post1_memory,
    post1_rollout,
    post2_balance,
    post2_counts,
    post2_dispatch,
    post2_dynamic,
    post2_forward,
    post2_params,
    post2_static,
)
from labkit.ui.seed_claims.record import CLAIMS, VERDICTS, Claim, Result, verdict

__all__ = ["VERDICTS", "Claim", "Result", "all_claims", "results", "verdict"]


def all_claims(posts: Iterable[int] = (1, 2)) -> list[Claim]:
    """The registered claims of ``posts``, post 1 first, in claim order."""
    wanted = set(posts)
    return sorted((c for c in CLAIMS if c.post in wanted), key=lambda c: (c.post, int(c.id.split("-")[1])))


def results(posts: Iterable[int] = (1, 2)) -> list[Result]:
    """Run the check of every claim of ``posts``."""
    return [c.run() for c in all_claims(posts)]
