"""megatron-core 0.16.1 as a test oracle: imported from .oracle/megatron-core-0.16.1 (Makefile: ORACLE_MCORE).

``mcore()`` puts the oracle on sys.path and imports it; without the folder the calling test skips, except under
CI=true, where it fails. ``run_schedule`` runs megatron-core's own ``forward_backward_*`` function for one pipeline
stage with the compute and the P2P stubbed: forward_step records (F, micro-batch, chunk) and returns that tag as
the output tensor, backward_step records the tag of the output tensor the schedule hands it, send/recv move nothing.
So the order it records is the schedule's own control flow, on CPU, one stage at a time.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ORACLE_MCORE = Path(__file__).resolve().parents[1] / ".oracle" / "megatron-core-0.16.1"


def mcore() -> Any:
    """The oracle's modules (parallel_state, schedules, ...), or skip (fail under CI) when it is not installed."""
    if not (ORACLE_MCORE / "megatron" / "core").is_dir():
        reason = f"megatron-core 0.16.1 oracle missing at {ORACLE_MCORE} (run `make venv` to install it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    if str(ORACLE_MCORE) not in sys.path:
        sys.path.insert(0, str(ORACLE_MCORE))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state
        from megatron.core.enums import ModelType
        from megatron.core.model_parallel_config import ModelParallelConfig
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.transformer.cuda_graphs import convert_schedule_table_to_order
    assert str(ORACLE_MCORE) in parallel_state.__file__, parallel_state.__file__
    return SimpleNamespace(
        parallel_state=parallel_state,
        schedules=schedules,
        ModelParallelConfig=ModelParallelConfig,
        ModelType=ModelType,
        convert_schedule_table_to_order=convert_schedule_table_to_order,
    )


class Group:
    """A process group that only knows its size and this rank's place in it."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


class FakeP2P:
    """megatron-core's P2PCommunicator with every send/recv a no-op (receives return None)."""

    def __init__(self, pp: int, stage: int, vpp: int | None, config: Any) -> None:
        self.pp_group, self.config, self.virtual_pipeline_model_parallel_size = Group(pp, stage), config, vpp

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("send", "recv")):
            return lambda *a, **k: (None, None) if name == "send_forward_backward_recv_forward_backward" else None
        raise AttributeError(name)


@contextlib.contextmanager
def _patched(m: Any, log: list):
    import torch

    s, zeros = m.schedules, torch.zeros
    saved = s.forward_step, s.backward_step

    def forward_step(fsf, it, model, nmb, inp, store, config, *args, **kw):
        tag = ("F", kw["current_microbatch"], model.chunk)
        log.append(tag)
        return tag, 0

    def backward_step(inp, out, out_grad, model_type, config):
        log.append(("B", out[1], out[2]))

    def cpu_zeros(*a, **k):  # the interleaved schedule counts tokens in a CUDA tensor
        k.pop("device", None)
        return zeros(*a, **k)

    s.forward_step, s.backward_step, torch.zeros = forward_step, backward_step, cpu_zeros
    try:
        yield
    finally:
        s.forward_step, s.backward_step = saved
        torch.zeros = zeros


def run_schedule(
    m: Any, pp: int, stage: int, vpp: int | None, num_microbatches: int, group_size: int | None, forward_only: bool
) -> list[tuple[str, int, int]]:
    """megatron-core's own schedule for ``stage``: the (F|B, micro-batch, chunk) it runs, in order. Raises what
    megatron-core raises (its interleaving checks)."""
    import torch

    cfg = m.ModelParallelConfig(
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        microbatch_group_size_per_vp_stage=group_size,
        pipeline_dtype=torch.float32,
    )
    cfg.hidden_size, cfg.fine_grained_activation_offloading = 8, False
    interleaved = pp > 1 and vpp is not None
    chunks = vpp if interleaved else 1
    models = []
    for c in range(chunks):
        mod = torch.nn.Module()
        mod.config, mod.model_type, mod.chunk = cfg, m.ModelType.encoder_or_decoder, c
        models.append(mod)
    fn = m.schedules.get_forward_backward_func(pp, vpp)
    pg = SimpleNamespace(tp=Group(1, 0), cp=Group(1, 0), embd=None, pos_embd=None, pp=Group(pp, stage))
    pg.dp_cp = Group(1, 0)
    log: list[tuple[str, int, int]] = []
    with _patched(m, log):
        fn(
            forward_step_func=None,
            data_iterator=[None] * chunks if interleaved else None,
            model=models if interleaved else models[0],
            num_microbatches=num_microbatches,
            seq_length=1,
            micro_batch_size=1,
            forward_only=forward_only,
            p2p_communicator=FakeP2P(pp, stage, vpp, cfg),
            pg_collection=pg,
        )
    return log


def init_model_parallel(m: Any, world_size: int, **kwargs: Any) -> dict[str, list[list[int]]]:
    """Run megatron-core's ``initialize_model_parallel`` for a world of ``world_size`` with no process group made:
    torch.distributed answers W and rank 0, ``create_group`` records its ranks under its ``group_desc``. Returns
    {group_desc: [ranks, ...]}; raises what megatron-core raises. The module's globals are reset after."""
    import torch

    ps, dist = m.parallel_state, torch.distributed
    made: dict[str, list[list[int]]] = {}

    def create_group(ranks=None, timeout=None, backend=None, pg_options=None, group_desc=None, **kw):
        made.setdefault(group_desc, []).append(list(ranks))
        return object()

    saved = ps.create_group, dist.is_initialized, dist.get_world_size, dist.get_rank
    ps.create_group, dist.is_initialized = create_group, lambda: True
    dist.get_world_size, dist.get_rank = (lambda group=None: world_size), (lambda group=None: 0)
    try:
        ps.initialize_model_parallel(create_gloo_process_groups=False, **kwargs)
    finally:
        ps.destroy_model_parallel()
        ps.create_group, dist.is_initialized, dist.get_world_size, dist.get_rank = saved
    return made
