"""Run verl's own code as a test oracle: 0.9.1 as installed, 0.7.1's seqlen_balancing.py loaded by path.

verl's rearrange_micro_batches all-reduces over a DP group; here each DP rank is a thread and a fake
`torch.distributed` reduces across the threads, so many multi-rank cases run in one process. Functions from verl
files that cannot be imported here (missing optional dependencies) are compiled from their source with `ast`.
"""

from __future__ import annotations

import ast
import importlib.util
import threading
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict


class _Group:
    """A fake DP process group: one slot per rank thread, a barrier per collective."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=30)
        self.slots: list[Any] = [None] * size
        self.local = threading.local()


class FakeDist:
    """Just what verl's seqlen_balancing uses from torch.distributed."""

    class ReduceOp:
        MAX = "max"
        MIN = "min"

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def all_reduce(tensor: torch.Tensor, op: str, group: _Group) -> None:
        group.slots[group.local.rank] = tensor.clone()
        group.barrier.wait()
        stacked = torch.stack(group.slots)
        reduced = stacked.max(dim=0).values if op == "max" else stacked.min(dim=0).values
        group.barrier.wait()
        tensor.copy_(reduced)


def make_batch(lens: list[int], layout: str, width: int | None) -> TensorDict:
    """A TensorDict like verl's: padded (attention_mask of `width` columns) or nested jagged input_ids."""
    if layout == "nested":
        rows = [torch.zeros(n, dtype=torch.long) for n in lens]
        ids = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        return TensorDict({"input_ids": ids}, batch_size=[len(lens)])
    w = width if width is not None else max(lens, default=0)
    mask = (torch.arange(w)[None, :] < torch.tensor(lens, dtype=torch.long).reshape(-1, 1)).long()
    return TensorDict({"input_ids": torch.zeros_like(mask), "attention_mask": mask}, batch_size=[len(lens)])


def _outcome(fn: Any) -> dict:
    try:
        return {"idx": fn()}
    except threading.BrokenBarrierError:
        return {"broken": True}
    except Exception as err:  # noqa: BLE001 - the oracle reports whatever verl raises
        return {"err": [type(err).__name__, str(err)]}


def run_rearrange_case(sb: Any, case: dict) -> list[dict]:
    """verl's rearrange_micro_batches on every rank of a case; threads + FakeDist when the case syncs."""
    ranks, kw = case["ranks"], dict(case.get("kw", {}))
    batches = [make_batch(lens, case["layout"], case.get("width")) for lens in ranks]
    if not case.get("sync"):
        return [_outcome(lambda b=b: sb.rearrange_micro_batches(b, case["budget"], **kw)[1]) for b in batches]
    group = _Group(len(ranks))
    results: list[Any] = [None] * len(ranks)

    def rank_main(r: int) -> None:
        group.local.rank = r
        results[r] = _outcome(lambda: sb.rearrange_micro_batches(batches[r], case["budget"], dp_group=group, **kw)[1])
        if "idx" not in results[r]:
            group.barrier.abort()  # peers would hang in verl; here they stop with BrokenBarrierError

    saved = sb.dist, sb.get_device_name
    sb.dist, sb.get_device_name = FakeDist, lambda: "cpu"  # verl would pick "cuda" on this CPU-only machine
    try:
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(ranks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sb.dist, sb.get_device_name = saved
    return results


def load_function(path: Path, name: str, namespace: dict, cls: str | None = None) -> Any:
    """Compile one function (optionally a method of `cls`) from a verl source file that cannot be imported here."""
    tree = ast.parse(path.read_text())
    body = tree.body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    module = ast.Module(body=[node], type_ignores=[])
    exec(compile(module, str(path), "exec"), namespace)  # noqa: S102 - verl's own code, as a test oracle
    return namespace[name]


def load_legacy_module(oracle_root: Path) -> Any:
    """verl 0.7.1's verl/utils/seqlen_balancing.py as a module (its verl.* imports resolve to the installed 0.9.1).

    Only DataProto, tensordict_utils.index_select_tensor_dict and get_device_name come from 0.9.1; the partitioning
    and micro-batch count logic under test is 0.7.1's own.
    """
    path = oracle_root / "verl" / "utils" / "seqlen_balancing.py"
    spec = importlib.util.spec_from_file_location("verl071_seqlen_balancing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
