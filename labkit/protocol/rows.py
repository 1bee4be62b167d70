"""DataProto's row-level operations: chunk, split, concat, reorder, repeat, sample_level_repeat, padding and
make_iterator, what dispatch and the actor's mini-batching build on.

``DataProtoRows`` is a mixin of labkit.protocol.data_proto.DataProto: it needs the three fields and
``is_padding_enabled`` only, so the container and its row arithmetic each read on their own. Mirrors those methods of
verl/protocol.py: DataProto."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Self

import numpy as np
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from labkit.protocol.ops import dict_of_lists, merge_meta_info
from labkit.rules.catalogue import message


class DataProtoRows:
    """Row-level operations of DataProto (a mixin: the DataProto dataclass supplies batch, non_tensor_batch, meta_info
    and is_padding_enabled)."""

    batch: TensorDict | None
    non_tensor_batch: dict
    meta_info: dict

    def chunk(self, chunks: int) -> list[Self]:
        """Cut rows into `chunks` consecutive pieces sharing meta_info (E26 unless auto-padding). Mirrors DataProto.chunk."""
        n = len(self)
        if not self.is_padding_enabled() and n % chunks != 0:
            raise AssertionError(message("E26", size=n, chunks=chunks))
        pieces_nt: list[dict] = [{} for _ in range(chunks)]
        if self.batch is not None:
            pieces_td = list(self.batch.chunk(chunks=chunks, dim=0))  # torch.chunk sizes: ceil(n/chunks) each
            if len(pieces_td) != chunks:
                raise AssertionError(
                    f"auto-padding chunk of {n} rows into {chunks} gives only {len(pieces_td)} "
                    f"pieces of ceil({n}/{chunks}) rows; pad to a multiple of {chunks} first"
                )
            bounds = np.cumsum([0] + [p.batch_size[0] for p in pieces_td])
            for key, val in self.non_tensor_batch.items():
                for i in range(chunks):
                    pieces_nt[i][key] = val[bounds[i] : bounds[i + 1]]
        else:
            pieces_td = [None] * chunks
            for key, val in self.non_tensor_batch.items():
                for i, part in enumerate(np.array_split(val, chunks)):
                    pieces_nt[i][key] = part
        return [
            type(self)(batch=pieces_td[i], non_tensor_batch=pieces_nt[i], meta_info=self.meta_info)
            for i in range(chunks)
        ]

    def split(self, split_size: int) -> list[Self]:
        """Consecutive pieces of `split_size` rows, the last may be shorter. Mirrors DataProto.split."""
        return [self[start : start + split_size] for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: list[Self]) -> Self:
        """Stack rows of several DataProtos; meta merged, `metrics` gathered into lists. Mirrors DataProto.concat."""
        batch = torch.cat([d.batch for d in data], dim=0) if data[0].batch is not None else None
        non_tensor = {
            k: np.concatenate(v, axis=0) for k, v in dict_of_lists([d.non_tensor_batch for d in data]).items()
        }
        meta = merge_meta_info([d.meta_info for d in data])
        return type(data[0])(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def reorder(self, indices: torch.Tensor) -> None:
        """Permute rows in place by a torch index tensor. Mirrors DataProto.reorder."""
        idx_np = indices.detach().numpy()
        self.batch = self.batch[indices]
        self.non_tensor_batch = {k: v[idx_np] for k, v in self.non_tensor_batch.items()}

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> Self:
        """interleave: a,a,b,b; else a,b,a,b; meta shared. Mirrors DataProto.repeat."""
        batch = None
        if self.batch is not None:
            if interleave:
                source = {k: v.repeat_interleave(repeat_times, dim=0) for k, v in self.batch.items()}
            else:
                source = {
                    k: v.unsqueeze(0).expand(repeat_times, *v.shape).reshape(-1, *v.shape[1:])
                    for k, v in self.batch.items()
                }
            batch = TensorDict(source=source, batch_size=(self.batch.batch_size[0] * repeat_times,))
        non_tensor = {
            k: np.repeat(v, repeat_times, axis=0) if interleave else np.tile(v, (repeat_times,) + (1,) * (v.ndim - 1))
            for k, v in self.non_tensor_batch.items()
        }
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    def sample_level_repeat(self, repeat_times: list[int] | tuple | np.ndarray | torch.Tensor) -> Self:
        """Row i repeated repeat_times[i] times, consecutively. Mirrors DataProto.sample_level_repeat."""
        if isinstance(repeat_times, (torch.Tensor, np.ndarray)):
            if len(repeat_times.shape) != 1:
                raise AssertionError(f"repeat_times must be 1-D, got shape {tuple(repeat_times.shape)}")
            repeat_times = repeat_times.tolist()
        elif not isinstance(repeat_times, (list, tuple)):
            raise AssertionError(
                f"repeat_times type must be in [list, torch.Tensor, np.ndarray, tuple], got {type(repeat_times)}"
            )
        counts = torch.tensor(list(repeat_times))
        batch = None
        if self.batch is not None:
            batch = TensorDict(
                source={k: v.repeat_interleave(counts, dim=0) for k, v in self.batch.items()},
                batch_size=(counts.sum().item(),),
                device=self.batch.device,
            )
        non_tensor = {k: np.repeat(v, counts, axis=0) for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append `padding_size` copies of the first ("first") or last row, in place. Mirrors DataProto.padding."""
        if padding_size == 0:
            return
        row = self.select_idxs([0 if padding_candidate == "first" else len(self) - 1])
        padded = DataProtoRows.concat([self, row.repeat(padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict | None = None,
        shuffle: bool | None = None,
    ) -> Iterator[Self]:
        """Mini-batches for `epochs` passes (E29); same DataLoader sampling as verl, so a seed gives verl's order.

        `shuffle` is a shortcut for dataloader_kwargs["shuffle"]. Mini-batches are collated as verl's collate_fn does
        (non-tensors become object arrays) and share meta_info. Mirrors DataProto.make_iterator."""
        n = self.batch.batch_size[0]
        if n % mini_batch_size != 0:
            raise AssertionError(f"{n} % {mini_batch_size} != 0")
        kwargs = dict(dataloader_kwargs or {})
        if shuffle is not None:
            kwargs["shuffle"] = shuffle
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        loader = DataLoader(
            dataset=range(n), batch_size=mini_batch_size, collate_fn=list, generator=generator, **kwargs
        )

        def collate(rows: list[int]) -> Self:
            batch = self.batch[torch.tensor(rows, dtype=torch.long)].contiguous()
            non_tensor = {k: np.array([v[i] for i in rows], dtype=object) for k, v in self.non_tensor_batch.items()}
            out = type(self)(batch=batch, non_tensor_batch=non_tensor)
            out.meta_info = self.meta_info
            return out

        def mini_batches() -> Iterator[Self]:
            for _ in range(epochs):
                for rows in loader:
                    yield collate(rows)

        return mini_batches()
