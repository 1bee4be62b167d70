"""Start JupyterLab on 127.0.0.1 at the start-here notebook, or say loudly why not (``make lab``).

Jupyter's own default moves to the next free port when 8888 is taken and prints a URL that lands on the Launcher;
here the port is fixed (``port_retries=0``), the printed URL opens the start notebook, and a taken port stops the
launch with what holds it. The browser test starts its server with the same command (``lab_argv``).
"""

from __future__ import annotations

import argparse
import errno
import os
import secrets
import socket
import sys
from pathlib import Path
from urllib.parse import quote

HOST = "127.0.0.1"
START_NOTEBOOK = "notebooks/00_start_here.ipynb"
# until the start-here notebook exists, the first lesson is where the lab opens
FALLBACK_NOTEBOOK = "notebooks/01_four_layers.ipynb"


def start_notebook(root: str | Path) -> str:
    """The notebook the lab opens at, relative to ``root``: 00_start_here if present, else 01."""
    return START_NOTEBOOK if (Path(root) / START_NOTEBOOK).exists() else FALLBACK_NOTEBOOK


def port_is_free(port: int, host: str = HOST) -> bool:
    """Whether ``host:port`` can be bound now (the check Jupyter itself makes, done first to say why not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = HOST) -> int:
    """A port the OS reports free on ``host`` (for tests that must not collide with a user's lab)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def lab_url(port: int, path: str, token: str | None = None, host: str = HOST) -> str:
    """The URL that opens ``path`` (relative to the server's root) in JupyterLab. ``reset``: JupyterLab starts from
    an empty workspace, so a reopened lab shows this notebook alone instead of every earlier tab, each with a kernel."""
    url = f"http://{host}:{port}/lab/tree/{quote(path)}?reset"
    return f"{url}&token={token}" if token else url


def lab_argv(root_dir: str | Path, port: int, open_path: str, extra: list[str] | tuple = ()) -> list[str]:
    """``jupyter lab`` on 127.0.0.1:``port`` with no port retries, serving ``root_dir``, its default URL the notebook
    ``open_path``. The token comes from ``JUPYTER_TOKEN`` in the environment (not the command line, which ``ps``
    shows to every user)."""
    argv = [sys.executable, "-m", "jupyterlab", f"--ip={HOST}", f"--port={port}", "--ServerApp.port_retries=0"]
    argv += [f"--ServerApp.root_dir={Path(root_dir).resolve()}", f"--LabApp.default_url=/lab/tree/{open_path}"]
    if os.geteuid() == 0:
        argv.append("--allow-root")  # Jupyter refuses root without it; CI and containers run as root
    return argv + list(extra)


def server_on(port: int) -> dict | None:
    """The Jupyter server of this user that listens on ``port`` (its url, token, root_dir), if any."""
    try:
        from jupyter_server.serverapp import list_running_servers
    except ImportError:  # pragma: no cover - jupyter_server comes with the lab extra
        return None
    for info in list_running_servers():
        if info.get("port") == port:
            return info
    return None


def taken_port_message(port: int, root: Path, info: dict | None) -> tuple[int, str]:
    """What ``make lab`` says, and its exit code, when ``port`` is taken: the URL of this repo's running lab (0), or
    what holds the port and how to choose another (1)."""
    if info is not None and Path(info.get("root_dir", "")).resolve() == root.resolve():
        url = lab_url(port, start_notebook(root), info.get("token"))
        return 0, f"JupyterLab already serves this repository on port {port}: open {url}"
    holder = f"a Jupyter server for {info.get('root_dir')} (pid {info.get('pid')})" if info else "another program"
    return 1, (
        f"make lab: port {port} on {HOST} is taken by {holder}. Jupyter would move to another port and the URL "
        f"below would open the wrong server, so nothing was started. Stop it, or run: make lab LAB_PORT={port + 1}"
    )


def main(argv: list[str] | None = None) -> int:
    """``make lab``: check the port, print the URL of the start notebook, then become the JupyterLab server."""
    ap = argparse.ArgumentParser(prog="python -m labkit.ui.lab_server", description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8888)
    ap.add_argument("--root", default=".", help="the repository root (served as JupyterLab's root)")
    ap.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    if not port_is_free(args.port):
        code, msg = taken_port_message(args.port, root, server_on(args.port))
        print(msg, file=sys.stderr if code else sys.stdout)
        return code
    env = dict(os.environ)
    env.setdefault("JUPYTER_TOKEN", secrets.token_hex(24))
    nb = start_notebook(root)
    cmd = lab_argv(root, args.port, nb)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    bar = "=" * 100
    print(f"{bar}\n  verl Batch Lab: open {lab_url(args.port, nb, env['JUPYTER_TOKEN'])}\n{bar}", flush=True)
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    sys.exit(main())
