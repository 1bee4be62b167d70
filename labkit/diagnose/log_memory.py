"""verl's own memory log lines read as measurements: ``log_gpu_memory_usage`` and ``GPUMemoryLogger``
(verl/utils/profiler/performance.py: "{head}, memory allocated (GB): a, memory reserved (GB): r, device memory
used/total (GB): u/t", GB meaning 2**30 bytes), the older "{head} memory allocated: aGB, reserved: rGB" and
"{head}: u GB / t GB." forms, and Megatron workers' variant with the max figures. They are what the GPU held at
named points of the step, beside labkit's prediction."""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit.diagnose.log_lines import LogLine

NUM = r"([0-9]+(?:\.[0-9]+)?)"
FORMS = (
    re.compile(
        rf"(?P<head>[^,]*?),? memory allocated \(GB\): (?P<a>{NUM[1:-1]}), (?:max memory allocated \(GB\): "
        rf"{NUM}, )?memory reserved \(GB\): (?P<r>{NUM[1:-1]})(?:, max memory reserved \(GB\): {NUM})?"
        rf"(?:, device memory used/total \(GB\): (?P<u>{NUM[1:-1]})/(?P<t>{NUM[1:-1]}))?"
    ),
    re.compile(
        rf"(?P<head>.*?) memory allocated: (?P<a>{NUM[1:-1]}) ?GB, (?:memory )?reserved: (?P<r>{NUM[1:-1]}) ?GB"
    ),
    re.compile(rf"(?P<head>.*?): (?P<u>{NUM[1:-1]}) GB / (?P<t>{NUM[1:-1]}) GB\.?$"),
)


@dataclass(frozen=True)
class MemoryMeasurement:
    """One memory log line: where in the step (``head``), PyTorch's allocated and reserved bytes, the device's used
    and total bytes (None where the line has no such figure)."""

    head: str
    line: int
    allocated: float | None = None
    reserved: float | None = None
    used: float | None = None
    total: float | None = None


def _gib(value: str | None) -> float | None:
    return float(value) if value is not None else None


def memory_measurements(lines: list[LogLine]) -> list[MemoryMeasurement]:
    """Every memory log line of the log, in order (values in GiB)."""
    out = []
    for line in lines:
        for form in FORMS:
            m = form.search(line.text)
            if not m:
                continue
            g = m.groupdict()
            head = re.sub(r"^.*?(?:=> \w+ |\] )", "", g["head"]).strip(" :=>")
            out.append(
                MemoryMeasurement(
                    head[-80:], line.number, _gib(g.get("a")), _gib(g.get("r")), _gib(g.get("u")), _gib(g.get("t"))
                )
            )
            break
    return out


def measurement_lines(found: list[MemoryMeasurement], predicted_gib: float | None, phase: str | None) -> list[str]:
    """The measurements as the answer shows them: the last few and the largest, beside labkit's prediction."""
    if not found:
        return []
    lines = ["verl's memory log (measured on the GPU, GiB):"]
    for m in found[-3:]:
        figures = [f"{k} {v:,.2f}" for k, v in (("allocated", m.allocated), ("reserved", m.reserved)) if v is not None]
        if m.used is not None:
            figures.append(f"device used {m.used:,.2f} of {m.total:,.2f}")
        lines.append(f"  line {m.line}: {m.head}: " + ", ".join(figures))
    top = max((m for m in found if m.reserved is not None), key=lambda m: m.reserved or 0, default=None)
    if top is not None:
        lines.append(f"  the most reserved: {top.reserved:,.2f} GiB ({top.head}, line {top.line})")
    if predicted_gib is not None and phase:
        lines.append(f"  labkit's prediction for {phase}: {predicted_gib:,.2f} GiB per GPU at its peak")
    return lines
