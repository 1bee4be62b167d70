"""verl's metrics lines (``step:3 - perf/max_memory_allocated_gb:61.2 - global_seqlen/max:81234 - ...``): the last
step's values, which say how far the run got and what the GPU held."""

from __future__ import annotations

import math
import re

from labkit.diagnose.log_lines import LogLine

ITEM = re.compile(r"(?:^| - )(?P<key>[\w/@.()-]+):(?P<value>[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|inf))")
SHOWN = (
    "perf/max_memory_allocated_gb",
    "perf/max_memory_reserved_gb",
    "perf/cpu_memory_used_gb",
    "global_seqlen/max",
    "global_seqlen/min",
    "global_seqlen/balanced_max",
    "response_length/max",
    "prompt_length/max",
    "timing_s/step",
    "timing_s/gen",
    "timing_s/update_actor",
)


def last_metrics(lines: list[LogLine]) -> dict[str, float]:
    """The metrics of the last ``step:N - ...`` line (finite values only), with ``step``; {} when there is none."""
    for line in reversed(lines):
        text = line.text.strip()
        if not text.startswith("step:"):
            continue
        values = {m.group("key"): float(m.group("value")) for m in ITEM.finditer(text)}
        return {k: v for k, v in values.items() if math.isfinite(v)}
    return {}
