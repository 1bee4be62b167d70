"""A rollout worker for tests/test_vllm_cleanup.py (importable by the rank processes): it raises on one rank when a
batch asks for it, before that rank reaches its engine, while its TP peer enters the engine's all-reduces."""

from __future__ import annotations

from typing import Any

from labkit.protocol.data_proto import DataProto
from labkit.rl.rollout import RolloutWorker
from labkit.runtime.dispatch import make_nd_compute_dataproto_dispatch_fn
from labkit.runtime.worker import register

RAISE_KEY = "test_raise_on_rank"


class RaisingRollout(RolloutWorker):
    """RolloutWorker whose ``generate_sequences`` raises on rank ``meta_info[RAISE_KEY]``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)

    @register(make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout"))
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        if prompts.meta_info.get(RAISE_KEY) == self.rank:
            raise RuntimeError(f"rank {self.rank} told to raise before its engine")
        return self._generate(prompts)
