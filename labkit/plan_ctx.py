"""The planner's shared state: sizes derived from a config (B, n, W, sp, D, rollout mesh), rank layouts, the
collective names the planner predicts (and the live runtime counts), and the stage-failure type.

Notation as in verl-reference.md: B prompts, n samples per prompt, W GPUs, sp Ulysses size, D = W/sp, rollout
mesh (dp, infer_tp, infer_pp) with infer_tp = tp·rdp (``ActorRolloutRefWorker._build_rollout``),
R = W/(infer_tp·infer_pp) replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ARR = "actor_rollout_ref"

# Stable collective names. Counts are calls issued by one rank in one stage of one training step; a call that runs
# once per FSDP unit or per attention layer (params all-gather, Ulysses all-to-all) is counted once per pass.
COLLECTIVES: dict[str, str] = {
    "all_gather(data_proto)": "≤v0.5 DP_COMPUTE_PROTO pre-processing: inputs all-gathered inside the rollout TP "
    "group (generate) or the Ulysses SP group (log-prob, update); once per call (all_gather_data_proto)",
    "all_reduce(max):num_micro_batches": "dynamic micro-batching: MAX of the micro-batch count over the DP group "
    "(legacy: the world group); once per rearrange_micro_batches call",
    "all_reduce(max):group_stats": "engine (0.9.1) dynamic micro-batching: MAX of (longest forced group, -#groups) "
    "before partitioning; once per rearrange_micro_batches call",
    "all_reduce(min):within_limit": "engine (0.9.1) hard token cap: AND of 'every bucket fits' over the DP group; "
    "once per partition attempt",
    "all_reduce(sum):batch_num_tokens": "engine forward_backward_batch: loss-mask tokens of the batch over the DP "
    "group (the global loss denominator); once per call (log-prob) or per mini-batch (update)",
    "all_gather(params)": "FSDP parameter all-gather for a forward pass; once per micro-batch forward",
    "all_gather(params):backward": "FSDP parameter re-gather for a backward pass (reshard after forward); once per "
    "micro-batch backward",
    "reduce_scatter(grads)": "FSDP gradient reduce-scatter: legacy after every micro-batch backward; engine only "
    "on the last micro-batch of a mini-batch (no_sync)",
    "all_reduce(sum):grad_norm": "gradient-norm all-reduce of clip_grad_norm_; once per optimizer step",
    "all_to_all(ulysses)": "Ulysses head/sequence all-to-all; once per micro-batch forward (sp > 1)",
    "all_to_all(ulysses):backward": "Ulysses all-to-all in the backward pass; once per micro-batch backward (sp > 1)",
    "all_gather(ulysses_outputs)": "gather_outputs_and_unpad of log-probs (or values) over the SP group; once per "
    "micro-batch forward (sp > 1)",
}


class StageFailure(Exception):
    """verl would stop at this stage: carries verl's exception type and exact message (with its E-code)."""

    def __init__(self, code: str, exc_type: str, message: str) -> None:
        super().__init__(message)
        self.code, self.exc_type, self.message = code, exc_type, message

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "exc_type": self.exc_type, "message": self.message}


def fail_chunk(n: int, k: int) -> StageFailure:
    """E26: ``DataProto.chunk(k)`` on a length not divisible by k (no auto-padding). Mirrors verl/protocol.py."""
    return StageFailure("E26", "AssertionError", f"only support equal chunk. Got size of DataProto {n} and chunk {k}.")


def mesh_failure(W: int, sp: int) -> StageFailure:
    """X4 (labkit code, as labkit.validate): torch cannot build the Ulysses mesh (W // sp, sp) when W % sp != 0."""
    return StageFailure("X4", "RuntimeError", f"torch init_device_mesh(mesh_shape=({W // sp}, {sp}), mesh_dim_names="
                        f"['dp', 'sp']) cannot cover a world of {W} ranks (exact text depends on the torch version)")


@dataclass
class Ctx:
    """Sizes of one training step, read once from the config (``build_ctx``)."""

    cfg: Any
    profile: str
    dispatch: str
    B: int
    n: int
    W: int
    sp: int
    tp: int
    rdp: int
    pp: int
    A: int
    width: int
    prompt_length: int
    response_length: int
    rmpad: bool
    lengths: list[int] | None
    N: int = 0
    D: int = 0
    infer_tp: int = 1
    R: int = 0
    order: list[list[int]] | None = None  # sample indices per actor DP rank after _balance_batch
    errors: dict[str, dict[str, str]] = field(default_factory=dict)
    cache: dict[Any, Any] = field(default_factory=dict)
    workloads: list[int] | None = None  # 24576·L + L² per sample (verl's calculate_workload)

    def __post_init__(self) -> None:
        if self.lengths is not None:
            self.workloads = [24576 * x + x * x for x in self.lengths]
        self.N = self.B * self.n
        self.D = self.W // self.sp if self.W % self.sp == 0 else 0
        self.infer_tp = self.tp * self.rdp
        size = self.infer_tp * self.pp
        self.R = self.W // size if self.W % size == 0 else 0

    def get(self, path: str) -> Any:
        return self.cfg.get(path)

    def tokens(self, idx: list[int]) -> int | None:
        return None if self.lengths is None else sum(map(self.lengths.__getitem__, idx))

    def workload(self, idx: list[int]) -> int | None:
        return None if self.workloads is None else sum(map(self.workloads.__getitem__, idx))

    def dp_chunks(self, dp: int) -> list[list[int]]:
        """Sample indices per DP rank when the balanced batch is chunked into ``dp`` equal pieces (nd dispatch).

        Uneven: E26 (legacy ``DataProto.chunk``) or E27 (engine ``chunk_tensordict``)."""
        if self.N % dp:
            if self.profile == "engine":  # 0.9.1 dispatches TensorDicts (tensordict_utils.py: chunk_tensordict)
                raise StageFailure("E27", "AssertionError",
                                   f"expecting td with length divisible by chunks, but got {self.N} and {dp}")
            raise fail_chunk(self.N, dp)
        flat = [i for part in self.order for i in part] if self.order is not None else list(range(self.N))
        size = self.N // dp
        return [flat[r * size:(r + 1) * size] for r in range(dp)]


def build_ctx(cfg: Any, lengths: list[int] | None, dispatch: str) -> Ctx:
    """Read every size the planner needs from ``cfg`` (a ``labkit.config.VerlConfig``)."""
    g = cfg.get
    pl, rl = g(f"{ARR}.rollout.prompt_length"), g(f"{ARR}.rollout.response_length")
    return Ctx(
        cfg=cfg, profile=cfg.profile, dispatch=dispatch,
        B=g("data.gen_batch_size") or g("data.train_batch_size"), n=g(f"{ARR}.rollout.n"), W=cfg.n_gpus,
        sp=g(f"{ARR}.actor.ulysses_sequence_parallel_size"), tp=g(f"{ARR}.rollout.tensor_model_parallel_size"),
        rdp=g(f"{ARR}.rollout.data_parallel_size"), pp=g(f"{ARR}.rollout.pipeline_model_parallel_size"),
        A=g(f"{ARR}.rollout.agent.num_workers"), width=pl + rl, prompt_length=pl, response_length=rl,
        rmpad=bool(g(f"{ARR}.{'model' if cfg.profile == 'engine' else 'actor'}.use_remove_padding")), lengths=lengths,
    )


def actor_layout(rank: int, sp: int) -> tuple[int, int]:
    """(dp_rank, sp_rank) of a global rank in the Ulysses mesh (dp, sp), row-major as init_device_mesh builds it."""
    return rank // sp, rank % sp


def rollout_layout(rank: int, infer_tp: int, infer_pp: int) -> tuple[int, int, int]:
    """(dp_rank, tp_rank, pp_rank) in the rollout mesh (dp, infer_tp, infer_pp), row-major (``_build_rollout``)."""
    return rank // (infer_tp * infer_pp), (rank // infer_pp) % infer_tp, rank % infer_pp


def ceil_div(a: int, b: int) -> int:
    return -(a // -b)


def ulysses_padded(tokens: int, sp: int) -> int:
    """Packed tokens after ``ulysses_pad``: round up to a multiple of sp (pad = (sp - nnz % sp) % sp)."""
    return ceil_div(tokens, sp) * sp
