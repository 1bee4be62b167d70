"""Fake CUDA on a CPU-only torch: tensors on device ``cuda`` that have shapes, dtypes and strides but no memory,
forward *and* backward, under ``torch.autocast("cuda", bfloat16)`` as verl runs its passes.

``FakeTensorMode`` alone runs forward ops on ``cuda`` tensors; autograd additionally asks for a CUDA device guard
and CUDA hooks, which a CPU build lacks. ``enable()`` compiles (once, cached per torch version) a few lines of C++
(``_shim/fake_cuda_hooks.cpp``) that register c10's own ``FakeGuardImpl`` for CUDA and CUDA hooks that say "built,
not available", loads them, and lets autocast accept ``cuda``/bf16. Nothing here touches a real GPU; on a CUDA build
of torch ``enable()`` does nothing but the autocast part is not needed either.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "_shim" / "fake_cuda_hooks.cpp"


def _cache_dir() -> Path:
    return Path(os.environ.get("LABKIT_CACHE", Path.home() / ".cache" / "labkit"))


def _torch_root() -> Path:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations, "torch is not installed"
    return Path(list(spec.submodule_search_locations)[0])


def _build() -> Path:
    root = _torch_root()
    lib = root / "lib" / "libtorch_cpu.so"
    stamp = f"{lib.stat().st_size}:{lib.stat().st_mtime_ns}" if lib.exists() else "cuda"
    key = hashlib.sha1(SOURCE.read_bytes() + stamp.encode()).hexdigest()[:12]
    out = _cache_dir() / f"fake_cuda_hooks-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [
        os.environ.get("CXX", "g++"),
        "-O1",
        "-shared",
        "-fPIC",
        "-std=c++20",
        "-w",
        "-D_GLIBCXX_USE_CXX11_ABI=1",  # torch's wheels since 2.7
        f"-I{root / 'include'}",
        str(SOURCE),
        f"-L{root / 'lib'}",
        "-lc10",
        "-ltorch_cpu",
        f"-Wl,-rpath,{root / 'lib'}",
        "-o",
        str(tmp),
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise RuntimeError(
            f"cannot build the fake-CUDA shim (needs g++ and torch's headers): {detail[-400:]}"
        ) from None
    tmp.replace(out)
    return out


@cache
def enable() -> None:
    """Make fake ``cuda`` tensors run forward and backward under bf16 autocast (idempotent). On a CPU-only torch the
    hooks must be registered before ``import torch`` (torch caches its accelerator at import): call this first in
    a fresh process (``labkit.model.trace_runner`` does)."""
    root = _torch_root()
    cpu_only = (root / "lib" / "libtorch_cpu.so").exists() and not list((root / "lib").glob("libtorch_cuda*.so"))
    if cpu_only:
        if "torch" in sys.modules:
            raise RuntimeError("fake_cuda.enable() must run before torch is imported (use labkit.model.trace_runner)")
        ctypes.CDLL(str(_build()), mode=ctypes.RTLD_GLOBAL)
    import torch
    import torch.cuda.amp.common as amp_common

    amp_common.amp_definitely_not_available = lambda: False  # autocast("cuda") checks this before it enables
    torch.cuda.is_bf16_supported = lambda *a, **k: True  # a real H100/H200 supports bf16
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # Hopper: transformers' grouped_mm experts


GPU_NATIVE = ("silu_backward",)
"""Ops with a native CUDA kernel that a CPU build sends to a composite fallback on fake ``cuda`` tensors (more ops,
more temporaries than a GPU makes): a never-called CUDA kernel restores the GPU's granularity."""
_LIB: list[Any] = []


def gpu_granularity() -> None:
    """Register ``GPU_NATIVE``'s never-called CUDA kernels once (after torch is imported, on fake ``cuda``)."""
    import torch

    if _LIB:
        return
    lib = torch.library.Library("aten", "IMPL")

    def never(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a real CUDA kernel was called on fake CUDA")

    for op in GPU_NATIVE:
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CUDA"):
            lib.impl(op, never, "CUDA")
    _LIB.append(lib)
