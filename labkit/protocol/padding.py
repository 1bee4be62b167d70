"""Pad a DataProto to a multiple of a divisor by repeating its first rows, and strip the padding again: what verl's
workers do before a dispatch that needs equal chunks. Mirrors verl/protocol.py: pad_dataproto_to_divisor,
unpad_dataproto.
"""

from __future__ import annotations

import logging

from labkit.protocol.data_proto import DataProto


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append rows taken from the start (cycling) up to a multiple of size_divisor; returns (padded, pad_size).

    Mirrors verl/protocol.py: pad_dataproto_to_divisor."""
    if not isinstance(data, DataProto):
        raise AssertionError("data must be a DataProto")
    n = len(data)
    if n % size_divisor == 0:
        if n == 0:
            logging.warning("padding a DataProto with no item, no changed made")
        return data, 0
    pad_size = size_divisor - n % size_divisor
    parts, missing = [data], pad_size
    while missing > 0:
        parts.append(data[: min(missing, n)])
        missing -= min(missing, n)
    return DataProto.concat(parts), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last pad_size rows (inverse of pad_dataproto_to_divisor). Mirrors verl/protocol.py: unpad_dataproto."""
    return data[:-pad_size] if pad_size != 0 else data
