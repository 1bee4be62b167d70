"""JupyterLab in a real browser for tests: a private server (127.0.0.1, a token, a free port, settings and state in a
temp folder) started with ``make lab``'s command, Debian's Chromium driven by Playwright, and the notebook actions the
browser test needs.

Every page.evaluate here returns at once (a JupyterLab command's promise is never awaited inside the page: that can
wait forever); waiting is done by wait_for_function with a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from labkit.ui import jupyter_settings, lab_server

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# Test-only user setting: no autosave (the test saves itself, after putting the parameters back); the rest is what a
# user of `make lab` gets.
TEST_USER_SETTINGS = {"@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False}}


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process's descendants (the server, kernels, ranks, the browser): the live ones
    and those they reaped. Read to tell the browser run's cost apart from a busy machine's wall time."""
    from _procs import descendants

    tick = os.sysconf("SC_CLK_TCK")
    total = os.times().children_user + os.times().children_system
    for pid in descendants(os.getpid()) - {os.getpid()}:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15]) / tick
    return total


def lab_processes() -> list[str]:
    """Command lines of this process's descendants that belong to a lab run: Chromium, Playwright's driver, the
    Jupyter server, kernels."""
    from _procs import cmdline, descendants

    marks = ("chromium", "playwright", "jupyterlab", "ipykernel_launcher")
    found = [cmdline(p) for p in descendants(os.getpid()) - {os.getpid()}]
    return [c[:120] for c in found if any(m in c for m in marks)]


def chromium_path() -> str | None:
    """Debian's Chromium (``apt-get install chromium``); Playwright's own browser downloads are never used."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"jupyter lab did not answer {url} within {timeout_s} s")


class LabServer:
    """A running private JupyterLab: ``port``, ``token``, ``root`` (what it serves), ``log`` (its output)."""

    def __init__(self, root: Path, state: Path, open_path: str):
        self.root, self.state, self.token = root, state, "labkit-browser-test"
        self.port = lab_server.free_port()
        self.log = state / "server.log"
        self.proc: subprocess.Popen | None = None
        self.started = time.time()
        self.open_path = open_path

    def api(self, path: str, method: str = "GET"):
        """One call of the server's REST API (JSON answer or None)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        req.add_header("Authorization", f"token {self.token}")
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def url(self, path: str) -> str:
        return lab_server.lab_url(self.port, path, self.token)

    def start(self, timeout_s: float = 60) -> None:
        s = self.state
        jupyter_settings.write_server_config(s / "etc" / "jupyter_server_config.json")
        jupyter_settings.write_lab_overrides(s / "app-settings")
        for name, values in TEST_USER_SETTINGS.items():
            (s / "user-settings" / name).parent.mkdir(parents=True, exist_ok=True)
            (s / "user-settings" / name).write_text(json.dumps(values))
        env = dict(
            os.environ,
            JUPYTER_TOKEN=self.token,
            JUPYTER_CONFIG_PATH=str(s / "etc"),
            JUPYTER_CONFIG_DIR=str(s / "config"),
            JUPYTER_DATA_DIR=str(s / "data"),
            JUPYTER_RUNTIME_DIR=str(s / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(s / "user-settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(s / "workspaces"),
        )
        extra = [
            "--no-browser",
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.app_settings_dir={s / 'app-settings'}",
        ]
        argv = lab_server.lab_argv(self.root, self.port, self.open_path, extra)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_http(f"http://127.0.0.1:{self.port}/api/status?token={self.token}", timeout_s, self.proc)

    def stop(self) -> None:
        """SIGTERM the server's process group (its kernels are in it too), SIGKILL what is left after 10 s."""
        if self.proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # kernels run in the server's session: none may outlive it
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def lab(root: Path, state: Path, open_path: str):
    """A started ``LabServer``, stopped in all cases."""
    server = LabServer(root, state, open_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextmanager
def chromium_page(viewport=(1200, 800)):
    """(page, console_errors): a Chromium page whose console errors and page errors are collected."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), headless=True, chromium_sandbox=False, args=CHROMIUM_FLAGS
        )
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.set_default_timeout(30_000)
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            yield page, errors
        finally:
            browser.close()


# JavaScript run in the page (JupyterLab's app is exposed as window.jupyterapp); each returns at once.
JS_HELPERS = """() => {
  const app = window.jupyterapp;
  const find = (path) => Array.from(app.shell.widgets('main')).find(w => w.context && w.context.path === path);
  const code = (w) => w.content.widgets.filter(c => c.model.type === 'code');
  const running = (c) => (c.model.executionState === 'running') || /\\*/.test(c.promptNode ? c.promptNode.textContent : '');
  window.__lab = {
    find,
    open: (path) => { app.commands.execute('docmanager:open', {path, factory: 'Notebook'}); return true; },
    ready: (path) => { const w = find(path); const k = w && w.sessionContext && w.sessionContext.session
                                 && w.sessionContext.session.kernel;
                       return !!(w && w.context.isReady && k && k.connectionStatus === 'connected' && k.status === 'idle'); },
    source: (path, i) => find(path).content.model.cells.get(i).sharedModel.getSource(),
    setSource: (path, i, text) => { find(path).content.model.cells.get(i).sharedModel.setSource(text); return true; },
    // the command names its notebook (widgetId, as the cell toolbar does): without it, it runs whichever notebook
    // the shell's focus tracker holds as current, which on a busy page can still be another one
    runAll: (path) => { const w = find(path); app.shell.activateById(w.id);
                        app.commands.execute('notebook:run-all-cells', {widgetId: w.id}); return true; },
    started: (path) => code(find(path)).some(c => running(c) || c.model.executionCount !== null),
    // done: the last code cell has its count, or a cell not tagged raises-exception failed (run-all stops there);
    // and nothing is queued or running (a cell can sit idle without its count for a moment in between)
    done: (path) => { const cs = code(find(path));
      if (cs.some(running)) return false;
      if (cs[cs.length - 1].model.executionCount !== null) return true;
      return cs.some(c => !((c.model.getMetadata('tags') || []).includes('raises-exception'))
                          && c.model.outputs.toJSON().some(o => o.output_type === 'error')); },
    cells: (path) => find(path).content.model.toJSON().cells.map(c => ({
        type: c.cell_type, count: c.execution_count === undefined ? null : c.execution_count,
        tags: (c.metadata && c.metadata.tags) || [], source: String(c.source).slice(0, 120),
        outputs: (c.outputs || []).map(o => ({type: o.output_type, ename: o.ename || '', evalue: o.evalue || '',
          name: o.name || '', text: String(o.text || '').slice(0, 200),
          widget: !!(o.data && o.data['application/vnd.jupyter.widget-view+json'])}))})),
    // the notebooks open in the main area (each has a kernel)
    openNotebooks: () => Array.from(app.shell.widgets('main')).filter(w => w.context && w.sessionContext).length,
    // the document's own save (the server's save hook applies); docmanager:save would save the current widget
    save: (path) => { find(path).context.save(); return true; },
    dirty: (path) => find(path).context.model.dirty,
    close: (path) => { find(path).close(); return true; },
    // close without saving: an opened notebook can be marked changed (JupyterLab fills in its metadata), and a
    // changed one asks before it closes
    discard: (path) => { const w = find(path); w.context.model.dirty = false; w.close(); return true; },
    toast: () => document.body.innerText.includes('official Jupyter news'),
    // the notebook gets the page's width (the file browser folds away; after the layout is restored)
    collapseLeft: () => { if (!app.shell.leftCollapsed) app.commands.execute('application:toggle-left-area');
                          return true; },
    // scroll the notebook so that the element matching sel is at the top of its panel
    scrollTo: (sel) => { const el = document.querySelector(sel); const outer = el && el.closest('.jp-WindowedPanel-outer');
                         if (!outer) return false;
                         if (document.activeElement) document.activeElement.blur();  // focus pulls the view back
                         outer.scrollTop += el.getBoundingClientRect().top - outer.getBoundingClientRect().top - 8;
                         return true; },
  };
  return true;
}"""


def install_helpers(page) -> None:
    page.wait_for_function(
        "() => !!(window.jupyterapp && window.jupyterapp.commands.hasCommand('docmanager:open'))", timeout=60_000
    )
    page.evaluate(JS_HELPERS)


def open_notebook(page, path: str) -> int:
    """Open ``path`` (or use its open tab), wait until its kernel is idle; return how many cells the page shows."""
    page.evaluate("p => window.__lab.find(p) ? true : window.__lab.open(p)", path)
    page.wait_for_function("p => window.__lab.ready(p)", arg=path, timeout=60_000)
    page.evaluate("() => window.__lab.collapseLeft()")
    return page.evaluate("p => window.__lab.find(p).content.widgets.length", path)


def run_notebook(page, path: str, params: str = "", timeout_s: float = 120) -> list[dict]:
    """Open ``path`` (or use its open tab), append ``params`` to its parameters cell (as papermill injects them), run
    all cells, wait until none is queued or running, and put the parameters cell back. Returns the cells' JSON."""
    open_notebook(page, path)
    original = page.evaluate("p => window.__lab.source(p, 1)", path)
    if params:
        page.evaluate("([p, s]) => window.__lab.setSource(p, 1, s)", [path, original + "\n" + params])
    page.evaluate("p => window.__lab.runAll(p)", path)
    page.wait_for_function("p => window.__lab.started(p)", arg=path, timeout=30_000)
    page.wait_for_function("p => window.__lab.done(p)", arg=path, timeout=timeout_s * 1000, polling=250)
    if params:
        page.evaluate("([p, s]) => window.__lab.setSource(p, 1, s)", [path, original])
    return page.evaluate("p => window.__lab.cells(p)", path)


def save_and_close(page, path: str, save: bool = True) -> None:
    """Save the notebook and wait until it is clean (``save``), close its tab (its kernel shuts down)."""
    if save:
        page.evaluate("p => window.__lab.save(p)", path)
        page.wait_for_function("p => !window.__lab.dirty(p)", arg=path, timeout=30_000)
    page.evaluate("p => window.__lab.close(p)" if save else "p => window.__lab.discard(p)", path)
    page.wait_for_function("p => !window.__lab.find(p)", arg=path, timeout=10_000)
