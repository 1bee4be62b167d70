"""``make lab``'s setup: the notebook git filter and save hook, the Jupyter settings, the launcher's port handling."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from labkit.ui import jupyter_settings, lab_server, notebook_filter

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _executed(text: str) -> dict:
    """A tracked notebook as a JupyterLab run and save leaves it: outputs, counts, widget state, kernel details."""
    nb = json.loads(text)
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb["metadata"]["language_info"].update(
        {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py", "version": "3.11.2"}
    )
    nb["metadata"]["language_info"].update({"mimetype": "text/x-python", "pygments_lexer": "ipython3"})
    nb["metadata"]["language_info"]["nbconvert_exporter"] = "python"
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        cell["execution_count"] = i + 1
        cell["metadata"].update({"execution": {"iopub.status.busy": "2026-01-01T00:00:00Z"}, "scrolled": True})
        cell["outputs"] = [
            {"output_type": "stream", "name": "stdout", "text": ["x = 1\n"]},
            {"output_type": "display_data", "data": {"text/plain": ["<Figure>"]}, "metadata": {}},
        ]
    return nb


def _git(root: Path, *args: str) -> str:
    cmd = ["git", "-C", str(root), "-c", "user.email=lab@test", "-c", "user.name=lab test", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    """A git repository holding notebook 01 as tracked, with the lab's attributes and filter installed."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / ".gitattributes").write_text((ROOT / ".gitattributes").read_text())
    (tmp_path / "notebooks" / "lesson.ipynb").write_text(NOTEBOOKS[0].read_text())
    _git(tmp_path, "init", "-q")
    assert notebook_filter.install(tmp_path, python=sys.executable)
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "tracked")
    return tmp_path


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tracked_notebooks_are_what_the_filter_makes(path):
    """A tracked notebook cleans to its own bytes: the filter never shows a change nobody made."""
    text = path.read_text()
    assert notebook_filter.clean_text(text) == text


def test_the_filter_strips_what_nbstripout_strips():
    """labkit's filter against nbstripout (--keep-id, plus the language_info keys) on an executed notebook."""
    from nbformat import from_dict, writes
    from nbstripout import strip_output

    text = NOTEBOOKS[0].read_text()
    executed = _executed(text)
    ours = notebook_filter.clean_text(json.dumps(executed))
    extra = [f"metadata.language_info.{k}" for k in notebook_filter.LANGUAGE_KEYS]
    extra += ["metadata.signature", "metadata.widgets"] + [f"cell.metadata.{k}" for k in notebook_filter.CELL_KEYS]
    theirs = strip_output(from_dict(copy.deepcopy(executed)), None, False, True, extra_keys=extra)
    assert ours == writes(theirs) + "\n"
    assert ours == text  # back to the tracked bytes


def test_git_never_sees_the_outputs(repo):
    """With outputs on disk, git diff is empty and git add stages nothing; git status still flags the file (its size
    changed), which is why the lab also saves tracked notebooks stripped (the pre-save hook below)."""
    nb = repo / "notebooks" / "lesson.ipynb"
    nb.write_text(json.dumps(_executed(nb.read_text()), indent=1))
    assert _git(repo, "diff") == ""
    assert _git(repo, "status", "--porcelain") == " M notebooks/lesson.ipynb\n"
    _git(repo, "add", "-A")
    assert _git(repo, "diff", "--cached") == "" and _git(repo, "status", "--porcelain") == ""
    assert '"output_type"' in nb.read_text()  # the outputs stay on disk


def test_pre_save_hook_strips_tracked_notebooks_only(repo):
    class Manager:
        root_dir = str(repo)

    tracked = NOTEBOOKS[0].read_text()
    mine = {"type": "notebook", "content": _executed(tracked)}
    mine["content"]["metadata"]["kernelspec"]["display_name"] = "Python 3"  # JupyterLab renames the same kernel
    notebook_filter.pre_save_hook(mine, "notebooks/lesson.ipynb", Manager())
    assert notebook_filter.clean_text(json.dumps(mine["content"])) == tracked
    assert all(not c.get("outputs") for c in mine["content"]["cells"])
    scratch = {"type": "notebook", "content": _executed(tracked)}
    notebook_filter.pre_save_hook(scratch, "notebooks/scratch.ipynb", Manager())
    assert scratch["content"] == _executed(tracked)  # untracked: saved as it is
    text = {"type": "file", "content": "x"}
    notebook_filter.pre_save_hook(text, "notebooks/lesson.ipynb", Manager())
    assert text == {"type": "file", "content": "x"}


def test_install_needs_git_and_the_attributes(tmp_path):
    assert notebook_filter.install(tmp_path) == {}
    assert notebook_filter.attributes_ok(ROOT)
    assert notebook_filter.main(["install", str(tmp_path)]) == 1  # no .gitattributes there


def test_jupyter_settings_land_where_jupyter_reads_them(tmp_path):
    from jupyter_core.paths import jupyter_config_path
    from jupyterlab.labapp import LabApp

    assert Path(LabApp().app_settings_dir).resolve() == jupyter_settings.lab_settings_dir(sys.prefix).resolve()
    assert str(jupyter_settings.server_config_path(sys.prefix).parent) in jupyter_config_path()
    cfg = jupyter_settings.server_config_path(tmp_path)
    cfg.parent.mkdir(parents=True)
    cfg.write_text(json.dumps({"ServerApp": {"iopub_data_rate_limit": 1}}))  # a user's own setting stays
    lab, server = jupyter_settings.write_settings(tmp_path)
    assert json.loads(lab.read_text()) == jupyter_settings.LAB_OVERRIDES
    written = json.loads(server.read_text())
    assert written["ServerApp"] == {"iopub_data_rate_limit": 1}
    assert written["MappingKernelManager"]["cull_idle_timeout"] == jupyter_settings.CULL_IDLE_TIMEOUT_S > 0
    assert written["ContentsManager"]["pre_save_hook"] == "labkit.ui.notebook_filter.pre_save_hook"


def test_start_notebook_is_00_when_it_exists(tmp_path):
    (tmp_path / "notebooks").mkdir()
    assert lab_server.start_notebook(tmp_path) == lab_server.FALLBACK_NOTEBOOK
    (tmp_path / lab_server.START_NOTEBOOK).write_text("{}")
    assert lab_server.start_notebook(tmp_path) == lab_server.START_NOTEBOOK


def test_launch_command(capsys):
    assert lab_server.main(["--port", "8891", "--root", str(ROOT), "--dry-run"]) == 0
    cmd = capsys.readouterr().out
    assert "--ip=127.0.0.1 --port=8891 --ServerApp.port_retries=0" in cmd
    assert f"--LabApp.default_url=/lab/tree/{lab_server.start_notebook(ROOT)}" in cmd


def test_taken_port_messages():
    code, msg = lab_server.taken_port_message(8888, ROOT, {"root_dir": str(ROOT), "token": "abc", "pid": 1})
    assert code == 0 and lab_server.lab_url(8888, lab_server.start_notebook(ROOT), "abc") in msg
    code, msg = lab_server.taken_port_message(8888, ROOT, {"root_dir": "/elsewhere", "pid": 42})
    assert code == 1 and "/elsewhere (pid 42)" in msg and "LAB_PORT=8889" in msg
    code, msg = lab_server.taken_port_message(8888, ROOT, None)
    assert code == 1 and "another program" in msg


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_make_lab_serves_the_start_notebook_and_never_moves_port(tmp_path):
    """``make lab``'s launcher, live: its URL opens the start notebook; a second launch on the same port prints the
    running lab's URL instead of starting; Jupyter itself on a taken port exits (no silent move)."""
    port = lab_server.free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    env.update(JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"))
    env["BROWSER"] = "true"  # no browser window from a test
    launch = [sys.executable, "-m", "labkit.ui.lab_server", "--port", str(port), "--root", str(ROOT)]
    log = tmp_path / "lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(launch, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (url := next((w for w in log.read_text().split() if w.startswith("http://")), None)):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert url.startswith(f"http://127.0.0.1:{port}/lab/tree/{lab_server.start_notebook(ROOT)}?reset&token=")
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    assert r.status == 200 and "JupyterLab" in r.read().decode()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
        token = url.split("&token=")[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/?token={token}", timeout=10) as r:
            assert r.geturl().split("?")[0] == url.split("?")[0]  # the server's root redirects to the start notebook
        again = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and f"open {url}" in again.stdout, (again.stdout, again.stderr)
        jupyter = lab_server.lab_argv(ROOT, port, lab_server.start_notebook(ROOT), ["--no-browser"])
        direct = subprocess.run(jupyter, env=env, capture_output=True, text=True, timeout=90)
        assert direct.returncode != 0 and f"port {port} is not available" in direct.stderr
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


def test_a_port_held_by_another_program_stops_the_launch(capsys):
    with socket.socket() as s:
        s.bind((lab_server.HOST, 0))
        s.listen()
        port = s.getsockname()[1]
        assert not lab_server.port_is_free(port)
        assert lab_server.main(["--port", str(port), "--root", str(ROOT)]) == 1
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is taken" in err and "nothing was started" in err
