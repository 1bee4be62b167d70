"""Test-wide settings: offline Hugging Face, quiet Ray, one thread per process, a clear GPU skip, and a temp folder
of this test process's own."""

import multiprocessing.util
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

# Every temp folder this test process and what it starts make (multiprocessing's pymp-*, torch's torchelastic_*,
# labkit's group folders, Ray's sessions) lands in a folder of its own (short: Ray's socket paths must fit 107
# bytes), so a leftover check reads what this run made and not what another job on the machine makes in /tmp.
PRIVATE_TMP = tempfile.mkdtemp(prefix="lkt-", dir="/tmp")
os.environ["TMPDIR"] = PRIVATE_TMP
tempfile.tempdir = None
# removed at exit after multiprocessing removes its own pymp-* folder in it (its finalizer has exitpriority -100)
multiprocessing.util.Finalize(
    None, shutil.rmtree, args=(PRIVATE_TMP,), kwargs={"ignore_errors": True}, exitpriority=-101
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip on machines without CUDA, and say so. For pytest-xdist's ``--dist loadgroup`` (``make
    test``), every test file is one group, so its module fixtures (a vLLM group, a Ray cluster, the browser's lab)
    start once; each notebook run is a group of its own, so the notebooks spread over both workers. ``tryfirst``: xdist's
    worker reads the marks in its own hook of this name, after this one. (Under pytest 9 xdist 3.8 could not rename
    the node ids at all: every test was a unit of its own and a file's module fixtures started on both workers;
    pyproject pins pytest 8.)"""
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
