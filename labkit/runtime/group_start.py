"""What the driver checks and prepares before a worker group's ranks start: the group's arguments, that local rank
processes can import the worker class by name (they unpickle it by reference, so a class of a notebook, a REPL or
stdin, or one defined inside a function, would only fail in the ranks), and the arguments every rank's RankHost is
built with."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from labkit.runtime.process_group import check_timeout, free_port


def check_group_args(worker_cls: type, world_size: int, init_kwargs: dict | None, timeouts: dict[str, Any]) -> dict:
    """A positive int world size, every timeout finite and > 0, then worker_cls.check_world on the init kwargs (on the
    driver, before any process starts); returns the init kwargs as a dict of their own."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    for key, value in timeouts.items():
        check_timeout(key, value)
    init_kwargs = dict(init_kwargs or {})
    worker_cls.check_world(world_size, **init_kwargs) if hasattr(worker_cls, "check_world") else None
    return init_kwargs


def rank_host_kwargs(
    worker_cls: type,
    world_size: int,
    init_kwargs: dict,
    env: dict[str, str],
    backend: str,
    device_kind: str,
    collective_timeout_s: float,
    rendezvous_timeout_s: float,
) -> list[dict[str, Any]]:
    """One RankHost's keyword arguments per rank; the group's rendezvous port is picked free now."""
    port = free_port()
    return [
        dict(
            worker_cls=worker_cls,
            rank=r,
            world_size=world_size,
            master_port=port,
            init_kwargs=init_kwargs,
            env=dict(env or {}),
            backend=backend,
            device_kind=device_kind,
            collective_timeout_s=collective_timeout_s,
            rendezvous_timeout_s=rendezvous_timeout_s,
        )
        for r in range(world_size)
    ]


def check_importable(worker_cls: type) -> None:
    """Local rank processes unpickle the worker class by reference: it must be importable from a module (or from a
    script's __main__, which multiprocessing re-imports); a class of a notebook/REPL/stdin, or one defined inside a
    function, would only fail in the ranks ("exited with code 1")."""
    module, qualname = getattr(worker_cls, "__module__", None), getattr(worker_cls, "__qualname__", "")
    hint = (
        "launcher='local' starts ranks that import the worker class by name: define it in an importable module "
        "(e.g. under labkit/), or use launcher='ray', which ships classes by value"
    )
    if "<locals>" in qualname:
        raise ValueError(f"worker class {qualname} is defined inside a function; {hint}")
    if module == "__main__":
        main = sys.modules.get("__main__")
        spec_name = getattr(getattr(main, "__spec__", None), "name", None)
        main_file = getattr(main, "__file__", None) or ""
        if not spec_name and not os.path.isfile(main_file):
            raise ValueError(
                f"worker class {qualname} is defined in an interactive __main__ (notebook, REPL or "
                f"stdin) that rank processes cannot import; {hint}"
            )
        return
    try:
        obj: Any = importlib.import_module(module or "")
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"worker class {module}.{qualname} cannot be imported by name ({exc}); {hint}") from None
    if obj is not worker_cls:
        raise ValueError(f"{module}.{qualname} is not the worker class passed (redefined or shadowed); {hint}")
