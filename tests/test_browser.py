"""The lab as a user meets it, in a real browser: JupyterLab (``make lab``'s command, 127.0.0.1, a token, a free
port) driven through Debian's Chromium by Playwright.

The start notebook runs all its cells, two of its widgets are moved with the keyboard, and each move must change the
verdict to what labkit predicts and redraw a plot; the first DOM change after each key press is timed in the page
(MutationObserver + performance.now()) and must come within ``LATENCY_BOUND_MS``. Every other notebook then runs all
its cells in the browser (with small parameters where its defaults are slow; papermill runs the defaults in
tests/test_notebooks.py) and fails on an error output outside a cell tagged ``raises-exception`` or on a console
error; the live notebooks (``LIVE``) are only opened and rendered unless LABKIT_BROWSER_LIVE=1. Each notebook is then saved (the lab's save hook stores a notebook git tracks without its outputs) and closed:
``git status`` of the served repository must stay clean, and the closed tabs must leave no kernel. Screenshots, the
latencies and the server log go to artifacts/browser/ (git-ignored).

Needs ``chromium`` (``apt-get install chromium``; .ci/run installs it). Without it the test skips, except on CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _jupyterlab as jl
import pytest
from _known_configs import GRPO_7B_8K

from labkit.ui import lab_server, notebook_filter

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts" / "browser"
START = lab_server.start_notebook(ROOT)
# The switch: the start-here dashboard is driven through the CSS classes of its widgets; while notebooks/ has no
# 00_start_here, notebook 01's sliders panel stands in (lab_server.start_notebook picks the notebook).
START_HERE = START == lab_server.START_NOTEBOOK
OTHERS = sorted(
    f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if f"notebooks/{p.name}" != START
)
# Small parameters for the browser run (appended to the parameters cell; the defaults run under papermill).
BROWSER_PARAMS = {
    "02_rollout_and_dispatch": 'LAUNCHER = "local"\nNEW_TOKENS = 8',
    "05_remove_padding_and_ulysses": "HEAD_TOKENS = 256",
    "06_live_step": "STEPS = 1\nLEARN_STEPS = 4",
    "08_hangs": "REAL_FSDP = False\nDRAWS = 8",
    "12_megatron": "LIVE = False",
}
# The live notebooks run in the browser only with LABKIT_BROWSER_LIVE=1: even with the small parameters above they
# take the test past its budget of about 150 s on 2 cores (measured at load 4: 199 s with them, 141 s without; at
# load 6 they took 147 of 262 s), and papermill runs them in tests/test_notebooks.py. Without it they are opened,
# rendered and closed, not run.
LIVE = {"06_live_step", "07_oom_debugging", "08_hangs", "12_megatron"}
RUN_LIVE = os.environ.get("LABKIT_BROWSER_LIVE") == "1"
RAN: set[str] = set()  # the notebooks this run executed and saved (the git check below looks at these)
# The goal is 100 ms from key press to the first DOM change. On CI's 2 busy cores a move pays the websocket
# round trip, the kernel's check + plan and the re-render, so the test bounds the median move and the slowest one.
LATENCY_BOUND_MS = {"median": 250.0, "max": 1000.0}
RUN_TIMEOUT_S = 150
# notebook 07's config (the eager entropy of a 16-row log-prob micro-batch of 9,216-token rows: 15+ terms stacked)
OOM_CONFIG = GRPO_7B_8K
QWEN3_MOE = ROOT / "tests/data/launch_scripts/verl-1dda039/examples/grpo_trainer/run_qwen3_30b_a3b_fsdp.sh"
WALK_OPTIONS = {"03_micro_batches", "04_balance_batch"}  # their Try-it panel: every dropdown option answers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _skip_reason() -> str | None:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (the test extra pins it)"
    if jl.chromium_path() is None:
        return "no chromium on PATH (apt-get install chromium)"
    return None


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A private JupyterLab serving a git repository made of the tracked notebooks, with the lab's git filter."""
    reason = _skip_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; .ci/run must install it")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("lab-root")
    state = tmp_path_factory.mktemp("lab-state")
    shutil.copytree(ROOT / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for name in (".gitattributes", ".gitignore"):
        shutil.copy(ROOT / name, root / name)
    git = ["git", "-C", str(root), "-c", "user.email=lab@test", "-c", "user.name=lab test"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert notebook_filter.install(root, python=sys.executable)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "tracked notebooks"], check=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    t_start, cpu_start = time.perf_counter(), jl.tree_cpu_s()
    t0 = time.perf_counter()
    with jl.lab(root, state, START) as server:
        print(f"jupyter lab answers after {time.perf_counter() - t0:.1f} s")
        with jl.chromium_page() as (page, console_errors):
            t0 = time.perf_counter()
            page.goto(server.url(START))
            jl.install_helpers(page)
            print(f"JupyterLab loaded in the browser in {time.perf_counter() - t0:.1f} s")
            yield server, page, console_errors
            (ARTIFACTS / "server.log").write_text(server.log.read_text())
    assert server.proc.poll() is not None
    deadline = time.monotonic() + 10  # the browser, its driver, the server and its kernels: all gone
    while (left := jl.lab_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left running: {left}"
    print(f"browser test: {time.perf_counter() - t_start:.0f} s, {jl.tree_cpu_s() - cpu_start:.0f} CPU-s in all")


def _check_cells(name: str, cells: list[dict]) -> None:
    """No error output outside a cell tagged raises-exception (JupyterLab runs on past those), and every code cell
    ran."""
    code = [c for c in cells if c["type"] == "code"]
    for c in code:
        errors = [o for o in c["outputs"] if o["type"] == "error"]
        assert not errors or "raises-exception" in c["tags"], f"{name}: {errors[0]['ename']}: {errors[0]['evalue']}"
    not_run = [c["source"] for c in code if c["count"] is None]
    assert code and not not_run, f"{name}: a cell did not run: {not_run[:1]}"


def _check_clean_outputs(name: str, cells: list[dict]) -> None:
    """What a user sees after Run All: no stderr block (a red box that reads as an error), and every ``if
    INTERACTIVE:`` section shows its output, a panel its widgets (the lab runs the defaults, INTERACTIVE = True)."""
    stderr = [o["text"] for c in cells if c["type"] == "code" for o in c["outputs"] if o["name"] == "stderr"]
    assert not stderr, f"{name}: stderr in a clean run: {stderr[:3]}"
    sections = [c for c in cells if c["type"] == "code" and c["source"].startswith("if INTERACTIVE")]
    empty = [c["source"][:60] for c in sections if not c["outputs"]]
    assert not empty, f"{name}: an interactive section shows nothing after Run All: {empty}"
    widgets = [c for c in sections if "panel" in c["source"] and not any(o["widget"] for o in c["outputs"])]
    assert not widgets, f"{name}: a panel shows no widget after Run All: {[c['source'][:60] for c in widgets]}"


# JupyterLab's own noise, not the notebook's: its debugger asks a new kernel for its state, and a tab closed before the
# answer (a notebook only opened) cancels the request
BENIGN_CONSOLE = ("Could not restore the debugger state: Canceled future for debug_request",)


def _no_console_errors(name: str, errors: list[str]) -> None:
    """No console error since the last check, but the benign ones (each notebook closes before this is called, so
    errors its closing raises are its own)."""
    time.sleep(0.5)
    found = [e for e in errors if not e.startswith(BENIGN_CONSOLE)]
    errors.clear()
    assert not found, f"{name}: console errors in the page: {found[:5]}"


# ---- the start notebook: run all, move two widgets, time the first DOM change ----------------------------------

LATENCY_JS = """(root) => {
  const targets = root.querySelectorAll('.widget-html, .widget-output, .labkit-verdict');
  const lat = window.__lat = {t0: null, t1: null};
  const obs = new MutationObserver(() => {
    if (lat.t0 !== null && lat.t1 === null) { lat.t1 = performance.now(); obs.disconnect(); } });
  targets.forEach(t => obs.observe(t, {subtree: true, childList: true, characterData: true, attributes: true}));
  const start = () => { if (lat.t0 === null) lat.t0 = performance.now(); };  // a key press, or a pasted text
  document.addEventListener('keydown', start, {capture: true, once: true});
  document.addEventListener('input', start, {capture: true, once: true});
  return targets.length;
}"""
PLOTS_JS = """(root) => JSON.stringify(Array.from(root.querySelectorAll('.js-plotly-plot'))
  .map(gd => (gd.data || []).map(t => [t.x, t.y])))"""


def _panel(page, path: str):
    """The output area of the notebook's last code cell (where its panel is displayed)."""
    return page.evaluate_handle(
        "p => { const w = window.__lab.find(p); const code = w.content.widgets.filter(c => c.model.type === 'code');"
        " return code[code.length - 1].node; }",
        path,
    ).as_element()


def _slider(panel, label: str):
    for s in panel.query_selector_all(".widget-slider"):
        lab = s.query_selector(".widget-label")
        if lab and lab.inner_text().strip() == label:
            return s
    raise AssertionError(f"no slider {label!r} in the panel")


def _slider_values(panel) -> dict[str, int]:
    return {
        s.query_selector(".widget-label").inner_text().strip(): int(s.query_selector(".widget-readout").inner_text())
        for s in panel.query_selector_all(".widget-slider")
    }


def _predicted_verdict(values: dict[str, int]) -> str | None:
    """labkit's verdict for notebook 01's panel at these slider values: verl's message, or None when it accepts."""
    from labkit.config.verl_config import load_config
    from labkit.ui.panels import FOUR_LAYER_SLIDERS
    from labkit.validate.report import check

    overrides = ["algorithm.adv_estimator=grpo"]  # notebook 01's seed beyond its sliders
    overrides += [f"{key}={values[label]}" for key, label, *_ in FOUR_LAYER_SLIDERS]
    first = check(load_config(overrides=overrides, profile="legacy")).first_error
    return None if first is None else first.message


def _move(page, panel, label: str, key: str) -> float:
    """Press ``key`` on slider ``label``; return ms from the key press to the first DOM change of the outputs."""
    panel.scroll_into_view_if_needed()
    handle = _slider(panel, label).query_selector(".noUi-handle")
    handle.focus()
    assert page.evaluate(LATENCY_JS, panel) >= 2
    handle.press(key)
    page.wait_for_function("() => window.__lat.t1 !== null", timeout=15_000)
    return page.evaluate("() => window.__lat.t1 - window.__lat.t0")


def _drive_four_layers_panel(page, path: str) -> list[float]:
    """Notebook 01's sliders panel (until the start-here dashboard exists)."""
    panel = _panel(page, path)
    latencies = []
    for label, key in [("rollout.n", "ArrowRight"), ("log-prob micro/GPU", "ArrowRight"), ("rollout.n", "ArrowLeft")]:
        before_plots = page.evaluate(PLOTS_JS, panel)
        before = _slider_values(panel)[label]
        latencies.append(_move(page, panel, label, key))
        values = _slider_values(panel)
        assert values[label] == before + (1 if key == "ArrowRight" else -1), (label, before, values[label])
        predicted = _predicted_verdict(values)
        want = "verl accepts" if predicted is None else re.sub(r"\s+", " ", predicted).strip()
        page.wait_for_function(
            "([root, want]) => root.innerText.replace(/\\s+/g, ' ').includes(want)", arg=[panel, want], timeout=15_000
        )
        page.wait_for_function(f"([root, b]) => ({PLOTS_JS})(root) !== b", arg=[panel, before_plots], timeout=15_000)
    page.screenshot(path=str(ARTIFACTS / "start_panel.png"))
    return latencies


# notebooks/00_start_here.ipynb's dashboard, through the CSS classes of labkit.ui.dashboard.CSS
DASH_ROOT, DASH_TEXT, DASH_PROFILE = ".labkit-dashboard", ".labkit-config-text textarea", ".labkit-profile"
DASH_CODE = ".labkit-dash-verdict [data-verl-code]"


def _dash_inputs(root) -> dict:
    """What the dashboard's controls hold now, as keywords of the dashboard module's ``state_of``."""
    pick = {k: root.query_selector(f".labkit-{k} button.mod-active") for k in ("profile", "loop")}
    values = {k: b.inner_text().strip() for k, b in pick.items() if b is not None}
    for k in ("lengths", "model", "gpu"):
        values[k] = root.query_selector(f".labkit-{k} select").input_value()
    values["seed"] = int(root.query_selector(".labkit-seed input").input_value())
    return values


def _dash_move(page, root, act) -> float:
    """Do ``act`` (an edit of one control); ms from its key press or input event to the first DOM change."""
    assert page.evaluate(LATENCY_JS, root) >= 2
    act()
    page.wait_for_function("() => window.__lat.t1 !== null", timeout=15_000)
    return page.evaluate("() => window.__lat.t1 - window.__lat.t0")


def _readme_picture(page, height: int = 1000) -> None:
    """The README's picture (docs/img/lab_tour.png is a copy): the dashboard as it first appears, from its config
    text and controls down through the verdict and the pipeline."""
    page.set_viewport_size({"width": 1200, "height": height + 300})
    try:
        assert page.evaluate("s => window.__lab.scrollTo(s)", DASH_ROOT)
        page.wait_for_timeout(500)
        box = page.query_selector(DASH_ROOT).bounding_box()
        clip = {"x": box["x"] - 4, "y": box["y"] - 4, "width": box["width"] + 8, "height": min(box["height"], height)}
        page.screenshot(path=str(ARTIFACTS / "lab_tour.png"), clip=clip)
    finally:
        page.set_viewport_size({"width": 1200, "height": 800})


def _drive_start_here(page, path: str) -> list[float]:
    from labkit.ui.dashboard import state_of

    root = page.wait_for_selector(DASH_ROOT, timeout=30_000)
    root.scroll_into_view_if_needed()
    text = root.query_selector(DASH_TEXT)
    original = text.input_value()
    gpus = re.search(r"trainer\.n_gpus_per_node=(\d+)", original)
    assert gpus, "the dashboard's config names trainer.n_gpus_per_node"
    rejected = original.replace(gpus.group(0), f"trainer.n_gpus_per_node={int(gpus.group(1)) - 2}")

    def paste(value):
        def act():
            text.evaluate("e => e.select()")
            page.keyboard.insert_text(value)

        return act

    def profile_key():
        other = next(
            b for b in root.query_selector_all(f"{DASH_PROFILE} button") if "mod-active" not in b.get_attribute("class")
        )
        other.focus()
        other.press("Space")

    latencies = []
    for act, plots_change in [(paste(rejected), True), (paste(original), True), (profile_key, False)]:
        before_plots = page.evaluate(PLOTS_JS, root)
        latencies.append(_dash_move(page, root, act))
        inputs = _dash_inputs(root)
        code = state_of(text.input_value(), **inputs).code  # labkit's prediction for what the controls hold
        page.wait_for_function(
            "([root, sel, code]) => { const c = root.querySelector(sel); return !!c && c.dataset.verlCode === code; }",
            arg=[root, DASH_CODE, code],
            timeout=15_000,
        )
        if plots_change:
            page.wait_for_function(f"([root, b]) => ({PLOTS_JS})(root) !== b", arg=[root, before_plots], timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "start_panel.png"))
    return latencies


# ---- what the page tells the user is true: colours per term, fixes that change something, no dead option -------

SETTLE_JS = """([node, ms]) => { const t = node.innerText; const now = performance.now();
  const s = window.__settle = window.__settle || {text: null, since: 0};
  if (t !== s.text) { s.text = t; s.since = now; return false; }
  return now - s.since >= ms && !t.includes('planning'); }"""
DEAD = "labkit cannot plan this"  # the card of a setting labkit cannot plan (lengths wider than the rows ...)


def _settle(page, node, quiet_ms: int = 600, timeout_ms: int = 90_000) -> str:
    """Wait until ``node``'s text has not changed for ``quiet_ms`` (and says no "planning…"); return it."""
    page.evaluate("() => { window.__settle = null; }")
    page.wait_for_function(SETTLE_JS, arg=[node, quiet_ms], timeout=timeout_ms, polling=100)
    return node.inner_text()


def _options(select) -> list[str]:
    return select.evaluate("s => Array.from(s.options).map(o => o.textContent)")


def _walk_selects(page, node, selects, where: str) -> int:
    """Choose every option of every ``<select>`` in turn, the others as they are; each must get an answer, never
    the card of a setting labkit cannot plan. Puts each select back. Returns how many options were tried."""
    tried = 0
    for sel in selects:
        first = sel.evaluate("s => s.options[s.selectedIndex].textContent")
        for label in [*_options(sel), first]:
            sel.select_option(label=label)
            text = _settle(page, node)
            tried += 1
            assert DEAD not in text, f"{where}: {label!r} gives no answer: {text[:400]}"
    return tried


def _paste(page, root, value: str) -> None:
    text = root.query_selector(DASH_TEXT)
    text.evaluate("e => e.select()")
    page.keyboard.insert_text(value)


def _choose(page, root, control: str, label: str) -> None:
    root.query_selector(f".labkit-{control} select").select_option(label=label)


MEMORY_JS = """(root) => { const gd = root.querySelector('.labkit-dash-memory-plot .js-plotly-plot');
  if (!gd || !gd.data) return null;
  const i = gd.data[0].x.indexOf('old_log_prob');
  let big = 0; gd.data.forEach((t, k) => { if (t.y[i] > gd.data[big].y[i]) big = k; });
  const groups = gd.querySelectorAll('.barlayer .trace.bars');
  const point = groups[big] ? groups[big].querySelectorAll('.point')[i] : null;
  const label = point && point.querySelector('.bartext');
  const legend = Array.from(gd.querySelectorAll('.legend .traces')).map(t => [t.textContent.trim(),
    (t.querySelector('.legendpoints path') || {style: {}}).style.fill]);
  return {largest: gd.data[big].name, label: label ? label.textContent : null, legend: legend,
          traces: gd.data.length, title: gd.layout.title.text}; }"""
FIXES_JS = """(root) => Array.from(root.querySelectorAll('.labkit-dash-memory table')).flatMap(t => {
  const head = Array.from(t.querySelectorAll('th')).map(h => h.textContent);
  return Array.from(t.querySelectorAll('tbody tr')).map(r => { const c = Array.from(r.querySelectorAll('td'));
    return {fix: c[head.indexOf('fix (alone)')].textContent, now: c[head.indexOf('now')].textContent}; }); })"""


def _check_dashboard_truths(page, root) -> None:
    """On the dashboard after Run All: notebook 07's config shows its old_log_prob bar with "entropy" written on
    its largest block and one legend colour per term; verl's run_qwen3_30b_a3b_fsdp.sh gets no fix it already has;
    every length and GPU option gives an answer."""
    from labkit.ui.dashboard import state_of

    engine = next(b for b in root.query_selector_all(f"{DASH_PROFILE} button") if b.inner_text().strip() == "engine")
    engine.click()  # the start test left the legacy profile on; 07 prices the engine's
    _paste(page, root, " ".join(OOM_CONFIG))
    _choose(page, root, "lengths", "none (rows only)")
    _choose(page, root, "model", "Qwen2.5-7B")
    _settle(page, root)
    page.wait_for_function(f"root => ({MEMORY_JS})(root) !== null", arg=root, timeout=30_000)
    mem = page.evaluate(MEMORY_JS, root)
    assert mem["largest"] == "entropy" and mem["label"] == "entropy", mem
    fills = [fill for _, fill in mem["legend"]]
    assert len(fills) == mem["traces"] and len(set(fills)) == len(fills), mem["legend"]
    assert "every row at full width" in mem["title"], mem["title"]
    root.query_selector(".labkit-dash-memory-plot").screenshot(path=str(ARTIFACTS / "memory_terms.png"))
    _paste(page, root, QWEN3_MOE.read_text())
    _choose(page, root, "model", "auto (model.path)")
    _settle(page, root)
    shown = page.evaluate(FIXES_JS, root)
    want = state_of(QWEN3_MOE.read_text(), **_dash_inputs(root)).memory.fixes[:8]
    assert shown and [r["fix"] for r in shown] == [f["set"] for f in want], (shown, want)
    assert all(r["fix"] != r["now"] and "use_dynamic_bsz=true" not in r["fix"] for r in shown), shown
    tried = _walk_selects(page, root, [root.query_selector(f".labkit-{c} select") for c in ("lengths", "gpu")], START)
    print(f"{START}: {tried} dashboard options, each answered")


def test_start_notebook_runs_and_its_widgets_answer(lab):
    server, page, console_errors = lab
    t0, cpu0 = time.perf_counter(), jl.tree_cpu_s()
    done = False
    try:
        cells = jl.run_notebook(page, START, timeout_s=RUN_TIMEOUT_S)
        print(f"{START}: run all {time.perf_counter() - t0:.1f} s, {jl.tree_cpu_s() - cpu0:.1f} CPU-s")
        _check_cells(START, cells)
        assert not page.evaluate("() => window.__lab.toast()"), "the news toast covers the notebook"
        if START_HERE:
            _readme_picture(page)
        latencies = (_drive_start_here if START_HERE else _drive_four_layers_panel)(page, START)
        if START_HERE:
            _check_dashboard_truths(page, page.query_selector(DASH_ROOT))
        done = True
    finally:  # a failure here must not leave the tab (and its kernel) to the next tests
        jl.save_and_close(page, START, save=done)
    RAN.add(START)
    summary = {"ms": [round(x, 1) for x in latencies], "median": round(statistics.median(latencies), 1)}
    (ARTIFACTS / "widget_latency.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"widget latency, key press to first DOM change: {summary}")
    _no_console_errors(START, console_errors)
    assert summary["median"] <= LATENCY_BOUND_MS["median"], summary
    assert max(latencies) <= LATENCY_BOUND_MS["max"], summary


# ---- every other notebook -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", OTHERS, ids=[Path(p).stem for p in OTHERS])
def test_notebook_runs_in_the_browser(lab, path):
    server, page, console_errors = lab
    stem = Path(path).stem
    run = stem not in LIVE or RUN_LIVE
    t0, cpu0, done = time.perf_counter(), jl.tree_cpu_s(), False
    try:
        if run:
            cells = jl.run_notebook(page, path, BROWSER_PARAMS.get(stem, ""), timeout_s=RUN_TIMEOUT_S)
            print(f"{path}: run all {time.perf_counter() - t0:.1f} s, {jl.tree_cpu_s() - cpu0:.1f} CPU-s")
            kernels, open_tabs = len(server.api("/api/kernels")), page.evaluate("() => window.__lab.openNotebooks()")
            assert kernels == open_tabs, f"{path}: {kernels} kernels for {open_tabs} open notebook(s)"
            if stem in WALK_OPTIONS:
                panel = _panel(page, path)
                panel.scroll_into_view_if_needed()
                page.wait_for_function(  # the widget views render after the kernel is done
                    "root => root.querySelectorAll('.widget-dropdown select').length > 0", arg=panel, timeout=30_000
                )
                tried = _walk_selects(page, panel, panel.query_selector_all(".widget-dropdown select"), path)
                assert tried >= 3, tried
                print(f"{path}: {tried} options of its panel, each answered")
        else:
            shown = jl.open_notebook(page, path)
            assert shown == len(json.loads((server.root / path).read_text())["cells"])
            print(f"{path}: opened, not run (LABKIT_BROWSER_LIVE=1 runs it)")
        page.screenshot(path=str(ARTIFACTS / f"{stem}.png"))
        done = run
    finally:  # saved only after a whole run; closed in any case (its kernel shuts down)
        jl.save_and_close(page, path, save=done)
    if run:
        _check_cells(path, cells)
        _check_clean_outputs(path, cells)
        RAN.add(path)
    _no_console_errors(path, console_errors)


def test_saved_notebooks_leave_git_clean_and_no_kernel(lab):
    """Each notebook above was saved after running (the lab's save hook keeps a tracked notebook as git stores it)
    and closed: git sees no change, and no kernel is left."""
    server, page, _ = lab
    root = server.root
    assert len(RAN) >= 2, RAN
    unsaved = [p for p in sorted(RAN) if (root / p).stat().st_mtime <= server.started]
    assert not unsaved, f"not saved: {unsaved}"
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
    diff = subprocess.run(["git", "-C", str(root), "diff"], capture_output=True, text=True).stdout
    assert status.returncode == 0 and status.stdout == "", (status.stdout, diff[:3000])
    deadline = time.monotonic() + 20
    while server.api("/api/kernels") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server.api("/api/kernels") == [], "closing a notebook must shut its kernel down"
    log = server.log.read_text()
    assert "Culling kernels with idle durations > 900 seconds" in log, "the culling settings were not read"
