"""The failures a verl log names: allocation failures (CUDA, vLLM's allocator, the CPU), NCCL watchdog timeouts per
rank, verl's own messages (matched against the error catalogue), Ray's host-memory kills and dead workers, and the
phase the traceback frames point at."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from labkit.diagnose.log_lines import LogLine
from labkit.diagnose.log_nccl import NcclTimeout, nccl_timeouts  # noqa: F401  (re-exported)
from labkit.rules.catalogue import code_of

UNIT = {"b": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6}
UNIT.update(gb=10**9, tb=10**12)
SIZE = r"([0-9]+(?:\.[0-9]+)?) ?(GiB|MiB|KiB|TiB|GB|MB|KB|B|bytes)"


def to_bytes(number: str, unit: str) -> int:
    """``13.91`` ``GiB`` as bytes."""
    return int(float(number) * UNIT[unit.lower()])


@dataclass
class AllocationFailure:
    """A failed allocation: ``device`` cuda | cpu | cuda-no-size (vLLM's cumem allocator, a bare CUDA error) |
    kv-cache (the engine found no memory for its KV pool) | engine-start (vLLM's start-up check: less free memory
    than its share u·C); the figures PyTorch or vLLM printed, in bytes, when it did."""

    device: str
    line: int
    requested: int | None = None
    gpu: int | None = None
    capacity: int | None = None
    free: int | None = None
    allocated: int | None = None
    """Allocated by PyTorch when it failed."""
    reserved_unallocated: int | None = None
    """Reserved by PyTorch's caching allocator but not allocated (fragmentation or cached blocks)."""
    share: float | None = None
    """engine-start: the gpu_memory_utilization vLLM printed (``requested`` is its u·C)."""
    process: int | None = None
    """This process's memory in use, non-PyTorch memory included ("this process has X memory in use")."""
    listed: list[tuple[int, int]] = field(default_factory=list)
    """The other holders PyTorch listed ("Process P has X memory in use"): (pid, bytes). In a container PyTorch
    cannot tell its own pid from NVML's, so this process may be among them (``labkit.diagnose.gpu_share`` tells)."""


OOM_NEW = re.compile(
    rf"CUDA out of memory\. Tried to allocate {SIZE}\. GPU (\d+) has a total capacity of {SIZE} of which {SIZE} is "
    r"free\.(?P<rest>.*)"
)
OOM_OLD = re.compile(
    rf"CUDA out of memory\. Tried to allocate {SIZE} \(GPU (\d+); {SIZE} total capacity; {SIZE} already allocated; "
    rf"{SIZE} free; {SIZE} reserved in total by PyTorch\)"
)
THIS_PROCESS = re.compile(rf"this process has {SIZE} memory in use")
HOLDER = re.compile(rf"Process (\d+) has {SIZE} memory in use")
BY_PYTORCH = re.compile(rf"Of the allocated memory {SIZE} is allocated by PyTorch")
UNALLOCATED = re.compile(rf"and {SIZE} is reserved by PyTorch but unallocated")
CPU = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate ([0-9]+) bytes")
CUDA_BARE = re.compile(r"(?:CUDA|cuda) error: out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation")
KV_POOL = re.compile(
    r"No available memory for the cache blocks|larger than the available KV cache memory|"
    r"Not enough memory\. Please try to increase --mem-fraction-static"
)
SGLANG_SAVER = re.compile(r"torch_memory_saver\S*\] CUresult error: 2 \(out of memory\)")
VLLM_START = re.compile(
    r"Free memory on device(?: \S+)? \(([0-9.]+)/([0-9.]+) GiB\) on startup is less than desired GPU memory "
    r"utilization \(([0-9.]+), ([0-9.]+) GiB\)"
)
"""vLLM V1's start-up check (vllm/v1/worker/gpu_worker.py, later v1/worker/utils.py ``request_memory``): the free
memory it measured, the total, gpu_memory_utilization and u·C; later releases name the device too."""


def _size(pattern: re.Pattern, text: str) -> int | None:
    m = pattern.search(text)
    return to_bytes(m.group(1), m.group(2)) if m else None


def _cuda_head(m: re.Match) -> dict[str, int]:
    """What both forms of PyTorch's message start with: the request, the GPU and its capacity."""
    return {
        "requested": to_bytes(m.group(1), m.group(2)),
        "gpu": int(m.group(3)),
        "capacity": to_bytes(m.group(4), m.group(5)),
    }


def allocation_failure(line: LogLine) -> AllocationFailure | None:
    """The allocation failure one line reports, or None."""
    text = line.text
    m = OOM_NEW.search(text)
    if m:
        rest = m.group("rest")
        return AllocationFailure(
            "cuda",
            line.number,
            **_cuda_head(m),
            free=to_bytes(m.group(6), m.group(7)),
            allocated=_size(BY_PYTORCH, rest),
            reserved_unallocated=_size(UNALLOCATED, rest),
            process=_size(THIS_PROCESS, rest),
            listed=[(int(p), to_bytes(n, u)) for p, n, u in HOLDER.findall(rest)],
        )
    m = OOM_OLD.search(text)
    if m:
        allocated, reserved = to_bytes(m.group(6), m.group(7)), to_bytes(m.group(10), m.group(11))
        return AllocationFailure(
            "cuda",
            line.number,
            **_cuda_head(m),
            free=to_bytes(m.group(8), m.group(9)),
            allocated=allocated,
            reserved_unallocated=max(0, reserved - allocated),
        )
    m = CPU.search(text)
    if m:
        return AllocationFailure("cpu", line.number, requested=int(m.group(1)))
    m = VLLM_START.search(text)
    if m:
        free, total, share, wanted = m.groups()
        return AllocationFailure(
            "engine-start",
            line.number,
            requested=to_bytes(wanted, "GiB"),
            capacity=to_bytes(total, "GiB"),
            free=to_bytes(free, "GiB"),
            share=float(share),
        )
    if KV_POOL.search(text):
        return AllocationFailure("kv-cache", line.number)
    if CUDA_BARE.search(text) or SGLANG_SAVER.search(text):
        return AllocationFailure("cuda-no-size", line.number)
    return None


def allocation_failures(lines: list[LogLine]) -> list[AllocationFailure]:
    """Every allocation failure of the log, in order. PyTorch's message hard-wrapped by a terminal or a paste
    ("… allocated by P" / "yTorch, …") is read with the line that continues it."""
    out = []
    for k, line in enumerate(lines):
        if "Tried to allocate" in line.text and "but unallocated" not in line.text:
            nxt = next((x for x in lines[k + 1 : k + 4] if "but unallocated" in x.text), None)
            if nxt is not None and "Tried to allocate" not in nxt.text:
                line = LogLine(line.text + nxt.text, line.source, line.number)
        found = allocation_failure(line)
        if found is not None:
            out.append(found)
    return out


@dataclass
class VerlMessage:
    """A message of verl's that the error catalogue knows: its code and the text as printed."""

    code: str
    text: str
    line: int


EXCEPTION = re.compile(r"(?:^|[\s(])(?:[\w.]+\.)?(?P<exc>\w*(?:Error|Exception))\)?: (?P<msg>.+)$")


def verl_messages(lines: list[LogLine]) -> list[VerlMessage]:
    """verl's own error messages in the log (an exception's message, or the line after a bare exception name),
    each matched to its catalogue code; the first of each code."""
    out: dict[str, VerlMessage] = {}
    previous = ""
    for line in lines:
        text = line.text.strip()
        candidates = []
        m = EXCEPTION.search(text)
        if m:
            candidates.append(m.group("msg").strip())
        if re.fullmatch(r"(?:[\w.]+\.)?\w*(?:Error|Exception)", previous):
            candidates.append(text)
        previous = text
        for msg in candidates:
            code = code_of(msg[:2000])
            if code and code not in out and code[0] in "EBX":
                out[code] = VerlMessage(code, msg, line.number)
    return list(out.values())


@dataclass
class HostOom:
    """Ray killed a process for host memory: what it was (Ray's task or actor name), its memory, the node's."""

    line: int
    process: str = ""
    process_gb: float | None = None
    node_used_gb: float | None = None
    node_total_gb: float | None = None
    threshold: float | None = None
    top: list[tuple[float, str]] = field(default_factory=list)
    """Ray's "Top 10 memory users": (GB, command)."""


RAY_OOM = re.compile(
    r"OutOfMemoryError: Task was killed due to the node running low on memory|killed due to memory pressure \(OOM\)"
)
NODE_MEMORY = re.compile(
    r"name=(?P<name>[^,]+), pid=\d+, memory used=(?P<proc>[0-9.]+)GB\) was running was (?P<used>[0-9.]+)GB / "
    r"(?P<total>[0-9.]+)GB \([0-9.]+\), which exceeds the memory usage threshold of (?P<thr>[0-9]*\.?[0-9]+)"
)
TOP_ROW = re.compile(r"^\s*\d+\s+(?P<gb>[0-9.]+)\s+(?P<cmd>\S.*)$")


def host_oom(lines: list[LogLine]) -> HostOom | None:
    """Ray's host-memory kill, with the figures it printed; None when the log has none."""
    found: HostOom | None = None
    in_table = False
    for line in lines:
        if RAY_OOM.search(line.text) and found is None:
            found = HostOom(line.number)
        m = NODE_MEMORY.search(line.text)
        if m:
            found = found or HostOom(line.number)
            found.process, found.process_gb = m.group("name").strip(), float(m.group("proc"))
            found.node_used_gb, found.node_total_gb = float(m.group("used")), float(m.group("total"))
            found.threshold = float(m.group("thr"))
        if re.match(r"^\s*PID\s+MEM\(GB\)\s+COMMAND", line.text):
            in_table = True
            found = found or HostOom(line.number)
            continue
        row = TOP_ROW.match(line.text) if in_table else None
        if row and found is not None and len(found.top) < 10:
            found.top.append((float(row.group("gb")), row.group("cmd").strip()))
        elif in_table and not row:
            in_table = False
    return found


DIED = re.compile(
    r"The actor died unexpectedly|A worker died or was killed|ActorDiedError|Worker exit type: SYSTEM_ERROR|"
    r"killed by SIGKILL|The actor is dead because"
)


def worker_died(lines: list[LogLine]) -> int | None:
    """The line where Ray reports a dead worker or actor (cause unknown to Ray), or None."""
    return next((line.number for line in lines if DIED.search(line.text)), None)


@dataclass
class LabRank:
    """One rank's line of labkit's own hang report (the hang lab, a live group's collective timeout): where it
    ended (``waited`` in a collective, ``returned``, ``raised``) and the collectives it issued by name."""

    rank: int
    outcome: str
    stage: str
    line: int
    collective: str = ""
    call: int | None = None
    issued: dict[str, int] = field(default_factory=dict)


LAB_WAITED = re.compile(
    r"^rank (\d+): waited [0-9.]+ s in (.+?) call #(\d+) \((\w+),[^)]*\) until the timeout; issued (.*)$"
)
LAB_ENDED = re.compile(r"^rank (\d+): (?:finished (\w+) and returned|raised .* in (\w+)); issued (.*)$")
ISSUED = re.compile(r"(.+?)×(\d+)")


def _issued(text: str) -> dict[str, int]:
    return {m.group(1).strip(): int(m.group(2)) for m in ISSUED.finditer(text.replace(", ", "\n").replace("\n", ","))}


def lab_ranks(lines: list[LogLine]) -> list[LabRank]:
    """The ranks of a labkit hang report, when the log holds one."""
    out = []
    for line in lines:
        text = line.text.strip()
        m = LAB_WAITED.match(text)
        if m:
            out.append(
                LabRank(
                    int(m.group(1)), "waited", m.group(4), line.number, m.group(2), int(m.group(3)), _issued(m.group(5))
                )
            )
            continue
        m = LAB_ENDED.match(text)
        if m:
            outcome = "returned" if m.group(2) else "raised"
            out.append(
                LabRank(int(m.group(1)), outcome, m.group(2) or m.group(3), line.number, issued=_issued(m.group(4)))
            )
    return out
