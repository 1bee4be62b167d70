"""Notebook outputs never reach git, and the lab's saves leave ``git status`` clean.

Two parts. A git clean filter for ``*.ipynb`` (``make lab`` and ``make test`` install it): ``git add`` and
``git diff`` see every notebook stripped, whatever wrote it. A Jupyter pre-save hook (``make venv`` configures it)
that saves a notebook git tracks the way git stores it: git reports a file whose size changed as modified without
running the filter, so a lesson saved with its outputs would show in ``git status`` although ``git diff`` is empty.
Notebooks git does not track keep their outputs.

The filter strips what nbstripout strips with ``--keep-id`` (outputs, execution counts, widget state, the volatile
metadata; tests/test_lab_setup.py checks the two agree), plus the kernel details a JupyterLab save adds to
``language_info``. It uses the standard library only: nbstripout imports nbformat and jsonschema, about 5 s per
call on a busy 2-core machine, and git runs the filter once for every changed notebook.

``.gitattributes`` (committed) names the filter; its command lives in the local git config, which a clone does not
carry, hence the install step.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ATTRIBUTES = "*.ipynb filter=nbstripout diff=ipynb"
# what nbstripout drops by default (besides outputs and counts), and what nbformat never writes (transient keys)
NOTEBOOK_KEYS = ("signature", "widgets", "orig_nbformat", "orig_nbformat_minor")
CELL_KEYS = ("collapsed", "ExecuteTime", "execution", "heading_collapsed", "hidden", "scrolled", "trusted")
# what a JupyterLab save adds to the tracked notebooks' language_info ({"name": "python"})
LANGUAGE_KEYS = ("codemirror_mode", "file_extension", "mimetype", "nbconvert_exporter", "pygments_lexer", "version")


def strip(nb: dict, split_source: bool = True) -> dict:
    """``nb`` (a notebook's JSON, changed in place) without outputs, counts and volatile metadata; ids kept.
    ``split_source``: sources as lists of lines, as nbformat writes them to disk."""
    meta = nb.get("metadata", {})
    for key in NOTEBOOK_KEYS:
        meta.pop(key, None)
    lang = meta.get("language_info")
    if isinstance(lang, dict):
        for key in LANGUAGE_KEYS:
            lang.pop(key, None)
    for cell in nb.get("cells", []):
        for key in CELL_KEYS:
            cell.get("metadata", {}).pop(key, None)
        if split_source and isinstance(cell.get("source"), str):
            cell["source"] = cell["source"].splitlines(True)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def clean_text(text: str) -> str:
    """The notebook ``text`` as git stores it, written as nbformat writes (indent 1, sorted keys, newline at end)."""
    nb = strip(json.loads(text))
    return json.dumps(nb, indent=1, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n"


def is_tracked(root: str | Path, path: str) -> bool:
    """Whether git tracks ``path`` (relative to ``root``); False outside a git work tree."""
    r = subprocess.run(["git", "-C", str(root), "ls-files", "--error-unmatch", "--", path], capture_output=True)
    return r.returncode == 0


def pre_save_hook(model: dict, path: str, contents_manager, **kwargs) -> None:
    """Jupyter's ``ContentsManager.pre_save_hook``: a notebook git tracks is saved without its outputs (they stay on
    screen until the tab closes) and keeps the kernelspec it has on disk when the kernel is the same one (JupyterLab
    rewrites its display name); any other file is saved as it is."""
    nb = model.get("content")
    root = Path(getattr(contents_manager, "root_dir", "."))
    if model.get("type") != "notebook" or nb is None or not is_tracked(root, path):
        return
    strip(nb, split_source=False)
    try:
        on_disk = json.loads((root / path).read_text()).get("metadata", {}).get("kernelspec")
    except (OSError, ValueError):
        return
    spec = nb.get("metadata", {}).get("kernelspec")
    if isinstance(on_disk, dict) and isinstance(spec, dict) and on_disk.get("name") == spec.get("name"):
        nb["metadata"]["kernelspec"] = on_disk


def filter_config(root: str | Path, python: str | None = None) -> dict[str, str]:
    """The git config entries of the filter. The interpreter is ``.venv/bin/python`` relative to the work tree when
    that venv is the one in use (git runs filters from the work tree's top, so each worktree finds its own), else
    this interpreter's absolute path (a conda env)."""
    venv = Path(root) / ".venv"
    if python is None and (venv / "bin" / "python").exists() and Path(sys.prefix).resolve() == venv.resolve():
        python = ".venv/bin/python"
    cmd = f"{shlex.quote(python or sys.executable)} -m labkit.ui.notebook_filter clean"
    return {"filter.nbstripout.clean": cmd, "filter.nbstripout.smudge": "cat", "diff.ipynb.textconv": f"{cmd} --file"}


def install(root: str | Path, python: str | None = None) -> dict[str, str]:
    """Write the filter into the git config of the repository at ``root`` and return what was set; {} outside a git
    work tree (an unpacked source archive)."""
    git = ["git", "-C", str(root)]
    inside = subprocess.run([*git, "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return {}
    entries = filter_config(root, python)
    for key, value in entries.items():
        subprocess.run([*git, "config", key, value], check=True)
    return entries


def attributes_ok(root: str | Path) -> bool:
    """Whether ``.gitattributes`` at ``root`` routes notebooks through the filter."""
    path = Path(root) / ".gitattributes"
    return path.exists() and ATTRIBUTES in path.read_text().splitlines()


def main(argv: list[str] | None = None) -> int:
    """``clean`` (stdin to stdout, git's clean filter), ``clean --file PATH`` (git's textconv), ``install [ROOT]``."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["clean"]:
        raw = Path(args[2]).read_bytes() if args[1:2] == ["--file"] else sys.stdin.buffer.read()
        sys.stdout.buffer.write(clean_text(raw.decode("utf-8")).encode("utf-8"))
        return 0
    if args[:1] == ["install"]:
        root = Path(args[1] if len(args) > 1 else ".")
        if not attributes_ok(root):
            print(f"{root / '.gitattributes'} lacks the line {ATTRIBUTES!r}", file=sys.stderr)
            return 1
        done = install(root)
        print("notebook outputs stay out of git: filter installed" if done else "not a git work tree: no filter")
        return 0
    print("usage: python -m labkit.ui.notebook_filter clean [--file PATH] | install [ROOT]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
