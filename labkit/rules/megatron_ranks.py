"""megatron-core's rank layout: which GPU holds which TP/CP/EP/DP/PP coordinate, and every process group it builds.

megatron-core numbers W GPUs by one order string (default ``tp-cp-ep-dp-pp``, the first token varying fastest), so
the dense rank is ``tp + TP·cp + TP·CP·dp + TP·CP·DP·pp``. A group of kind ``"dp-cp"`` holds the ranks that differ
only in their dp and cp coordinates; megatron-core enumerates the groups with the other coordinates (first fastest)
and each group's members with the grouped ones (first fastest). Experts use a second generator over
(ETP, EP, expert DP, PP) with the same order and CP folded into expert DP. Here each group kind is one integer array
[groups, members], built by a reshape and a transpose, so a 1,024-GPU layout costs microseconds, not a loop per rank.

Mirrors ``megatron/core/parallel_state.py: RankGenerator``, ``generate_masked_orthogonal_rank_groups`` and
``initialize_model_parallel`` (the groups and their checks, returned as data by ``layout_check``), and verl's
``verl/workers/engine/megatron/transformer_impl.py: MegatronEngine.is_mp_src_rank_with_outputs`` /
``get_data_parallel_rank`` (which ranks receive the same rows and which return the outputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from labkit.rules.parallel_layout import ParallelLayout

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
"""megatron-core's default ``order`` of ``initialize_model_parallel``; verl passes none."""
TOKENS = ("tp", "pp", "dp", "ep", "cp")
"""``RankGenerator.name_to_size`` key order: a size-1 token missing from the order is appended in this order."""
SOURCE = "megatron/core/parallel_state.py: initialize_model_parallel"
GENERATOR_SOURCE = "megatron/core/parallel_state.py: RankGenerator.__init__"

DENSE_GROUPS = {
    "tp": "tensor model parallel",
    "cp": "context parallel",
    "dp": "data parallel",
    "pp": "pipeline model parallel",
    "dp-cp": "data parallel with CP: gradient reduce-scatter, distributed-optimizer shard",
    "tp-pp": "model parallel",
    "tp-cp": "tensor and context parallel",
    "tp-dp": "tensor and data parallel",
    "tp-dp-cp": "tensor and data parallel with CP",
}
"""Dense group kinds (``decoder_rank_generator.get_ranks(kind)``) and what megatron-core builds from them."""
EXPERT_GROUPS = {
    "ep": "expert model parallel",
    "tp": "expert tensor parallel",
    "dp": "expert data parallel: expert gradients, expert optimizer shard",
    "tp-ep": "expert tensor and model parallel",
    "tp-ep-pp": "expert tensor, model and pipeline parallel",
}
"""Expert group kinds (``expert_decoder_rank_generator.get_ranks(kind)``)."""


@dataclass(frozen=True)
class RankCheck:
    """A megatron-core check that fails for a layout: the exception it raises, its exact text and the arithmetic."""

    error: str
    """``RuntimeError`` or ``AssertionError``."""
    message: str
    """megatron-core's message, verbatim (its typos included)."""
    arithmetic: str
    """The numbers behind it, e.g. ``W = 12, TP·PP·CP = 2·2·2 = 8, 12 % 8 = 4``."""
    source: str = SOURCE


def _tokens(order: str) -> list[str]:
    toks = order.lower().split("-")
    if len(set(toks)) != len(toks) or not set(toks) <= set(TOKENS):
        raise ValueError(f"order {order!r} must join distinct tokens of {'/'.join(TOKENS)} with '-'")
    return toks


def generator_check(tp: int, ep: int, dp: int, pp: int, cp: int, order: str = DEFAULT_ORDER) -> RankCheck | None:
    """The check ``RankGenerator(tp, ep, dp, pp, cp, order)`` fails first, or None. ``initialize_model_parallel``
    never trips the EP·CP one (its dense generator has ep=1, its expert one cp=1); a direct generator can."""
    if not (ep == 1 or cp == 1):
        msg = (
            "Both EP and CP > 1 in not allow in one rank generator.             CP is only included in default "
            "RankGenerator, and EP only in expert RankGenerator."
        )
        return RankCheck("AssertionError", msg, f"EP = {ep}, CP = {cp}", GENERATOR_SOURCE)
    toks = _tokens(order)
    for name, size in zip(TOKENS, (tp, pp, dp, ep, cp)):
        if name not in toks and size != 1:
            msg = f"The size of ({name}) is ({size}), but you haven'tspecified the order ({order})."
            return RankCheck("RuntimeError", msg, f"{name} = {size} is not in {order!r}", GENERATOR_SOURCE)
    return None


def _full_order(order: str) -> list[str]:
    toks = _tokens(order)
    return toks + [t for t in TOKENS if t not in toks]


def masked_groups(sizes: dict[str, int], order: list[str], kind: str) -> np.ndarray:
    """``generate_masked_orthogonal_rank_groups`` as one array [groups, members]: the ranks that differ only in the
    coordinates named in ``kind`` (e.g. ``"dp-cp"``), groups and members each enumerated first-token-fastest."""
    shape = [sizes[t] for t in order]
    n = len(order)
    grouped = {order.index(t) for t in kind.split("-")}
    # C-order array of the ranks: axis n-1-i is order[i], so the first token is the last (fastest) axis.
    ranks = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape[::-1])
    outer = [n - 1 - i for i in reversed(range(n)) if i not in grouped]
    inner = [n - 1 - i for i in reversed(range(n)) if i in grouped]
    size = int(np.prod([shape[i] for i in grouped]))
    return ranks.transpose(outer + inner).reshape(-1, size)


@dataclass(frozen=True)
class MegatronRanks:
    """Every rank's coordinates and every group megatron-core builds for one layout (``megatron_ranks`` makes it)."""

    layout: ParallelLayout
    order: list[str] = field(default_factory=lambda: _full_order(DEFAULT_ORDER))

    @property
    def sizes(self) -> dict[str, int]:
        """The dense generator's sizes (ep = 1)."""
        lay = self.layout
        return {"tp": lay.tp, "cp": lay.cp, "ep": 1, "dp": lay.dp_size, "pp": lay.pp}

    @property
    def expert_sizes(self) -> dict[str, int]:
        """The expert generator's sizes (tp = ETP, dp = expert DP, cp = 1)."""
        lay = self.layout
        return {"tp": lay.etp, "cp": 1, "ep": lay.ep, "dp": lay.expert_dp_size, "pp": lay.pp}

    @cached_property
    def coords(self) -> dict[str, np.ndarray]:
        """Per global rank (index), its tp, cp, dp, pp coordinates (dense) and ep (expert generator)."""
        ranks = np.arange(self.layout.world_size, dtype=np.int64)
        out = {t: self._coord(ranks, self.sizes, t) for t in ("tp", "cp", "dp", "pp")}
        out["ep"] = self._coord(ranks, self.expert_sizes, "ep")
        out["etp"] = self._coord(ranks, self.expert_sizes, "tp")
        out["edp"] = self._coord(ranks, self.expert_sizes, "dp")
        return out

    def _coord(self, ranks: np.ndarray, sizes: dict[str, int], token: str) -> np.ndarray:
        stride = 1
        for t in self.order:
            if t == token:
                return (ranks // stride) % sizes[t]
            stride *= sizes[t]
        raise AssertionError(token)

    def groups(self, kind: str) -> np.ndarray:
        """Dense groups of ``kind`` (a key of ``DENSE_GROUPS``, or any '-'-joined tokens) as [groups, members]."""
        return masked_groups(self.sizes, self.order, kind)

    def expert_groups(self, kind: str) -> np.ndarray:
        """Expert groups of ``kind`` (a key of ``EXPERT_GROUPS``: ``ep``, ``tp`` = expert TP, ``dp`` = expert DP)."""
        return masked_groups(self.expert_sizes, self.order, kind)

    def group_of(self, kind: str, rank: int, expert: bool = False) -> list[int]:
        """The ranks of ``rank``'s group of ``kind``."""
        g = self.expert_groups(kind) if expert else self.groups(kind)
        return g[np.nonzero(g == rank)[0][0]].tolist()

    def embedding_groups(self) -> list[list[int]]:
        """``default_embedding_ranks`` of each PP group: its first and last stage (one rank when PP = 1); tied
        embeddings sync their gradient here."""
        pp = self.groups("pp")
        return pp[:, [0, -1]].tolist() if pp.shape[1] > 1 else pp[:, :1].tolist()

    @property
    def data_rank(self) -> np.ndarray:
        """Per rank, the DP rank verl dispatches rows by (``get_data_parallel_rank``; 0 everywhere under dynamic CP,
        where every rank gets the whole batch)."""
        dp = self.coords["dp"]
        return np.zeros_like(dp) if self.layout.dynamic_context_parallel else dp

    def same_rows(self, dp_rank: int) -> list[int]:
        """The ranks that receive DP rank ``dp_rank``'s rows: all its TP, CP and PP ranks."""
        return np.nonzero(self.data_rank == dp_rank)[0].tolist()

    @property
    def output_ranks(self) -> np.ndarray:
        """The ranks whose outputs verl collects (``is_mp_src_rank_with_outputs``): TP rank 0 on the last PP stage
        with CP rank 0 (and DP rank 0 under dynamic CP); one per DP rank, ordered by DP rank."""
        c, lay = self.coords, self.layout
        keep = (c["tp"] == 0) & (c["pp"] == lay.pp - 1) & (c["cp"] == 0)
        if lay.dynamic_context_parallel:
            keep &= c["dp"] == 0
        ranks = np.nonzero(keep)[0]
        return ranks[np.argsort(c["dp"][ranks], kind="stable")]

    def rank_summary(self, rank: int) -> dict[str, int | bool]:
        """One rank's coordinates, its verl DP rank and whether it returns outputs."""
        c = self.coords
        out: dict[str, int | bool] = {k: int(v[rank]) for k, v in c.items()}
        out["data_rank"] = int(self.data_rank[rank])
        out["returns_outputs"] = bool(np.isin(rank, self.output_ranks))
        return out


def _positive(layout: ParallelLayout) -> None:
    sizes = {"world_size": layout.world_size, "tp": layout.tp, "pp": layout.pp, "cp": layout.cp}
    sizes |= {"ep": layout.ep, "etp": layout.etp}
    if layout.vpp is not None:
        sizes["vpp"] = layout.vpp
    for name, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"megatron {name} must be a positive integer, got {v!r}")


def layout_check(layout: ParallelLayout, order: str = DEFAULT_ORDER) -> RankCheck | None:
    """The first check of ``initialize_model_parallel`` that ``layout`` fails, in megatron-core's order, or None.
    Bad sizes (not positive integers) or a malformed order raise ValueError (not a megatron-core check)."""
    _positive(layout)
    lay, w = layout, layout.world_size
    model = lay.tp * lay.pp * lay.cp
    if w % model:
        arith = f"W = {w}, TP·PP·CP = {lay.tp}·{lay.pp}·{lay.cp} = {model}, {w} % {model} = {w % model}"
        return RankCheck("RuntimeError", f"world_size ({w}) is not divisible by {model}", arith)
    if lay.vpp is not None and not lay.pp > 1:
        msg = "pipeline-model-parallel size should be greater than 1 with interleaved schedule"
        return RankCheck("RuntimeError", msg, f"VPP = {lay.vpp} with PP = {lay.pp}")
    dp = w // model
    if bad := generator_check(lay.tp, 1, dp, lay.pp, lay.cp, order):
        return bad
    expert = lay.etp * lay.ep * lay.pp
    if w % expert:
        msg = f"world_size ({w}) is not divisible by expert_tensor_model_pipeline_parallel size ({expert})"
        arith = f"W = {w}, ETP·EP·PP = {lay.etp}·{lay.ep}·{lay.pp} = {expert}, {w} % {expert} = {w % expert}"
        return RankCheck("RuntimeError", msg, arith)
    edp = w // expert
    if bad := generator_check(lay.etp, lay.ep, edp, lay.pp, 1, order):
        return bad
    if not (order.endswith("pp") or lay.pp == 1 or edp == dp):
        msg = (
            "When not using pp-last rank ordering, the data parallel size of the attention and moe layers must be "
            "the same"
        )
        return RankCheck("AssertionError", msg, f"order {order!r}, DP = {dp}, expert DP = {edp}")
    ranks = MegatronRanks(layout, _full_order(order))
    dense_pp, expert_pp = ranks.groups("pp"), ranks.expert_groups("pp")
    if not np.array_equal(dense_pp, expert_pp):
        msg = (
            "Pipeline parallel groups are expected to be the same for Non-Expert and Expert part,     but got "
            f"{dense_pp.tolist()} and {expert_pp.tolist()}"
        )
        return RankCheck("AssertionError", msg, f"order {order!r}: the PP groups differ")
    return None


def megatron_ranks(layout: ParallelLayout, order: str = DEFAULT_ORDER) -> MegatronRanks:
    """The rank layout of a Megatron ``layout``; ValueError with megatron-core's message if ``layout_check`` fails."""
    if bad := layout_check(layout, order):
        raise ValueError(f"{bad.error}: {bad.message} ({bad.arithmetic})")
    return MegatronRanks(layout, _full_order(order))
