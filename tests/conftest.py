"""Test-wide settings: offline Hugging Face, quiet Ray, one thread per process, a clear GPU skip."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip on machines without CUDA, and say so. For pytest-xdist's ``--dist loadgroup`` (``make
    test``), every test file is one group, so its module fixtures (a vLLM group, a Ray cluster) start once; each
    notebook run is a group of its own, so the notebooks spread over both workers."""
    for item in items:
        group = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("notebook") and getattr(item, "callspec", None) is not None:
            group += "::" + item.callspec.id
        item.add_marker(pytest.mark.xdist_group(group))
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none (CI never has one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
