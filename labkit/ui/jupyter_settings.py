"""The JupyterLab and Jupyter server settings ``make venv`` writes into the venv: no news toast covering the notebook,
a notebook's kernel started when it opens and shut down when its tab closes, autosave within 10 s, idle kernels culled (each lesson's kernel holds torch, ~300 MB),
and tracked notebooks saved without outputs (``labkit.ui.notebook_filter.pre_save_hook``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# JupyterLab settings defaults (``<prefix>/share/jupyter/lab/settings/overrides.d``): a user's own settings still win.
# A notebook opens with its kernel started (no "Select Kernel" dialog) and is autosaved 10 s after a change: a tracked
# lesson is saved without outputs (they stay on screen), so closing it after Run All asks no "Save changes?".
LAB_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension:tracker": {"kernelShutdown": True, "autoStartDefaultKernel": True},
    "@jupyterlab/docmanager-extension:plugin": {"autosaveInterval": 10},
}
# Jupyter server config (``<prefix>/etc/jupyter/jupyter_server_config.json``): a kernel idle for 15 minutes is shut
# down, also while its notebook is open (Run All starts a new one); a busy kernel (a live run) is never culled.
CULL_IDLE_TIMEOUT_S = 900
SERVER_CONFIG = {
    "MappingKernelManager": {
        "cull_idle_timeout": CULL_IDLE_TIMEOUT_S,
        "cull_interval": 60,
        "cull_connected": True,
        "cull_busy": False,
    },
    "ContentsManager": {"pre_save_hook": "labkit.ui.notebook_filter.pre_save_hook"},
}
NAME = "labkit_lab.json"


def lab_settings_dir(prefix: str | Path) -> Path:
    """JupyterLab's application settings folder in an environment (LabApp.app_settings_dir's default)."""
    return Path(prefix) / "share" / "jupyter" / "lab" / "settings"


def server_config_path(prefix: str | Path) -> Path:
    """The server config file Jupyter reads in an environment. Its ``.d`` folder only enables extensions, so the
    settings go into the file itself."""
    return Path(prefix) / "etc" / "jupyter" / "jupyter_server_config.json"


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def write_lab_overrides(settings_dir: str | Path) -> Path:
    """Write ``LAB_OVERRIDES`` as ``<settings_dir>/overrides.d/labkit_lab.json`` and return its path."""
    return _write(Path(settings_dir) / "overrides.d" / NAME, LAB_OVERRIDES)


def write_server_config(path: str | Path) -> Path:
    """Merge ``SERVER_CONFIG`` into the JSON config file at ``path`` (other sections kept) and return its path."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    for section, values in SERVER_CONFIG.items():
        data.setdefault(section, {}).update(values)
    return _write(path, data)


def write_settings(prefix: str | Path) -> list[Path]:
    """Both files into the environment at ``prefix`` (a venv or a conda env)."""
    return [write_lab_overrides(lab_settings_dir(prefix)), write_server_config(server_config_path(prefix))]


if __name__ == "__main__":
    for p in write_settings(sys.argv[1] if len(sys.argv) > 1 else sys.prefix):
        print(f"wrote {p}")
