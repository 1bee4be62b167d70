"""Write JupyterLab overrides into a venv: no news/update toast covering the notebook."""

from __future__ import annotations

import json
import sys
from pathlib import Path

OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}


def write_overrides(prefix: str | Path) -> Path:
    """Create ``<prefix>/share/jupyter/lab/settings/overrides.json`` and return its path."""
    path = Path(prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(OVERRIDES, indent=2) + "\n")
    return path


if __name__ == "__main__":
    print(f"wrote {write_overrides(sys.argv[1] if len(sys.argv) > 1 else sys.prefix)}")
