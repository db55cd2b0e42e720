"""The dashboard in a real browser: JupyterLab and Notebook 7 on loopback, Debian's Chromium
driven by Playwright (never a downloaded browser), the quickstart notebook run as a person would.

Checks, in the page: every panel is drawn and has data; no legend covers an axis's tick labels,
an axis title or its panel's plot area; a zoom box dragged on a plot survives two refreshes;
the node table lists each worker; clicking Pause makes the run paused (click -> widget comm ->
kernel -> hub -> status poll -> widget -> page), also while a `--wait` cell blocks the kernel.
Saves screenshots into `out/`.
"""

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from tests.helpers import SYNTHETIC_CELL, fed_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "out"
CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")
WORKERS = 2


def chromium() -> str:
    """Debian's Chromium (`make system` installs it); this test never installs anything."""
    found = next((p for p in CHROMIUM if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.fail(f"Chromium is not installed here. Received: none of {', '.join(CHROMIUM)}. "
                    "Run `make system` as root (or `sudo apt-get install chromium`).")
    return found


def quickstart_until_the_dashboard(folder: Path) -> Path:
    """The quickstart notebook up to its %%distribute cell, at a size that trains long enough
    to click on (the parameter cell is overridden the way tests/e2e/test_notebooks.py does)."""
    nb = nbformat.read(ROOT / "notebooks" / "01-quickstart.ipynb", as_version=4)
    cut = next(i for i, c in enumerate(nb.cells) if c.source.startswith("%%distribute"))
    nb.cells = nb.cells[:cut + 1]
    tagged = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(tagged + 1, nbformat.v4.new_code_cell("EPOCHS = 500\nSAMPLES = 3000"))
    path = folder / "quickstart.ipynb"
    nbformat.write(nb, path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Each front-end: how to start its server, and where a notebook opens in it.
APPS = {"jupyterlab": ("jupyterlab", "/lab/tree/{name}",
                       ["--LabApp.news_url=",
                        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                        "--LabApp.extension_manager=readonly"]),
        "notebook7": ("notebook", "/notebooks/{name}", [])}


@pytest.fixture(params=list(APPS))
def jupyter(request, tmp_path):
    """JupyterLab, then Notebook 7, on loopback with a token, serving a folder of its own;
    every kernel it started is shut down (and with it the notebook's cluster) before it stops."""
    module, tree, flags = APPS[request.param]
    port, token = free_port(), secrets.token_hex(16)
    settings = tmp_path / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    apputils = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    apputils.mkdir(parents=True)
    (apputils / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython"),  # PYTHONPATH reaches the kernel
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    root = tmp_path / "root"
    root.mkdir()
    log_path = tmp_path / f"{request.param}.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", module, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", *flags,
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    # the local Jupyter server's http URLs only
    api = lambda path, method="GET": urllib.request.urlopen(  # noqa: E731, S310
        urllib.request.Request(f"{base}{path}?token={token}", method=method),  # noqa: S310
        timeout=10)
    deadline = time.monotonic() + 60
    while True:
        try:
            api("/api/status")
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(log_path.read_text()[-3000:]) from None
            time.sleep(0.5)
    yield {"app": request.param, "base": base, "token": token, "root": root, "api": api,
           "url": lambda name: f"{base}{tree.format(name=name)}?token={token}"}
    for kernel in json.load(api("/api/kernels")):
        api(f"/api/kernels/{kernel['id']}", method="DELETE")
    server.terminate()
    server.wait(30)
    log.close()
    leftover = _processes_mentioning(str(tmp_path))
    assert not leftover, f"processes left running after {request.param} stopped: {leftover}"


def _processes_mentioning(text: str, timeout: float = 30) -> list[str]:
    """Command lines (ipyparallel engines, controller, kernels) that still name `text`."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                env = (proc / "environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if (proc.name.isdigit() and int(proc.name) != os.getpid()
                    and (text in cmd or text in env)):
                found.append(f"{proc.name}: {cmd[:120]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1)


# Every plot of the dashboard, read in the page: its panel name, data, draw count, the boxes
# of its legend, plot area, tick labels and axis titles, and its x range now.
PANELS_JS = """(root, sel) => [...root.querySelectorAll(sel)].map(gd => {
  const box = e => {
    const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom];
  };
  const all = sel => [...gd.querySelectorAll(sel)]
    .filter(e => e.getBoundingClientRect().width > 0).map(box);
  const full = gd._fullLayout || {};
  return {name: gd.dataset.name || gd.id, revision: Number(gd.dataset.revision),
          title: ((full.title || {}).text) || '',
          points: (gd.data || []).reduce(
            (n, t) => n + ((t.x || (t.cells || {}).values || []).length || 0), 0),
          legend: all('.legend'), plot: all('.nsewdrag'),
          ticks: all('.xtick text, .ytick text, .y2tick text'),
          titles: all('.g-xtitle text, .g-ytitle text, .g-y2title text'),
          xrange: full.xaxis ? full.xaxis.range.slice() : null,
          autorange: full.xaxis ? full.xaxis.autorange : null};
})"""


def overlaps(a: list, b: list, slack: float = 1.0) -> bool:
    """Two [left, top, right, bottom] boxes share more than `slack` px both ways."""
    return min(a[2], b[2]) - max(a[0], b[0]) > slack and min(a[3], b[3]) - max(a[1], b[1]) > slack


def read_panels(root, selector: str = ".nbdist-plot") -> dict:
    return {p["name"]: p for p in root.evaluate(PANELS_JS, selector)}


def check_layout(panels: dict) -> None:
    """No legend covers tick labels, an axis title or the plot area of its panel."""
    for name, p in panels.items():
        for legend in p["legend"]:
            for kind, boxes in (("plot area", p["plot"]), ("tick label", p["ticks"]),
                                ("axis title", p["titles"])):
                hit = [b for b in boxes if overlaps(legend, b)]
                assert not hit, f"{name}: its legend {legend} covers a {kind} {hit[0]}"


def wait_for_revision(page, name: str, revision: int, timeout_ms: int = 60_000) -> None:
    page.wait_for_function(
        "([name, rev]) => [...document.querySelectorAll('.nbdist-plot')].some("
        "gd => gd.dataset.name === name && Number(gd.dataset.revision) >= rev)",
        arg=[name, revision], timeout=timeout_ms)


def idle_kernels(jupyter) -> list:
    """The server's idle kernels. None while the server answers 500: Notebook 7 once did so
    (CI, 2026-11-25) while the notebook's kernel was starting, and the next poll finds it."""
    try:
        kernels = json.load(jupyter["api"]("/api/kernels"))
    except urllib.error.HTTPError as exc:
        if exc.code != 500:
            raise
        return []
    return [k for k in kernels if k["execution_state"] == "idle"]


def run_all_cells(page, jupyter, name: str = "quickstart.ipynb") -> None:
    page.goto(jupyter["url"](name))
    page.locator(".jp-Notebook").wait_for(timeout=60_000)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:  # the front-end may ask which kernel to start
        page.locator(".jp-Dialog").get_by_role("button", name="Select").click(timeout=10_000)
    except PlaywrightTimeout:
        pass
    deadline = time.monotonic() + 60
    while not idle_kernels(jupyter):
        assert time.monotonic() < deadline, "the notebook's kernel did not start"
        time.sleep(0.5)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


@pytest.mark.cluster  # the quickstart notebook starts its own engines
# in JupyterLab: the quickstart's whole run costs a minute, and Notebook 7 draws the same
# widgets through the same renderer (its pause and stop act in the test below)
@pytest.mark.parametrize("jupyter", ["jupyterlab"], indirect=True)
def test_quickstart_dashboard_is_readable_keeps_zoom_and_pause_acts_on_the_run(jupyter):
    from playwright.sync_api import expect, sync_playwright

    from nbdist.dashboard.widget import PANELS

    quickstart_until_the_dashboard(jupyter["root"])
    OUT.mkdir(exist_ok=True)
    shot = lambda what: str(OUT / f"browser-{jupyter['app']}-{what}.png")  # noqa: E731
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 2200})
        try:
            run_all_cells(page, jupyter)
            dashboard = page.locator(".nbdist-dashboard")
            dashboard.wait_for(timeout=180_000)
            rows = dashboard.locator("table.nbdist-nodes tr.nbdist-node")
            expect(rows).to_have_count(WORKERS, timeout=120_000)
            for w in range(WORKERS):
                expect(rows.nth(w).locator("td").first).to_have_text(str(w))
            expect(dashboard.locator(".nbdist-status[data-status='running']")).to_have_count(1)

            # every panel drawn, with data (bounded wait: the loss panels draw every 2 s)
            plots = dashboard.locator(".nbdist-plot")
            expect(plots).to_have_count(len(PANELS), timeout=60_000)
            page.wait_for_function(
                "n => { const ps = [...document.querySelectorAll('.nbdist-plot')];"
                " return ps.length === n"
                " && ps.every(gd => (gd.data || []).some(t => (t.x || []).length > 0)); }",
                arg=len(PANELS), timeout=120_000)
            throughput = dashboard.locator(".nbdist-plot[data-name='throughput']")
            for w in range(WORKERS):  # one legend entry per worker; a mean and a raw line each
                expect(throughput.locator(".legendtext", has_text=f"worker {w}")).to_have_count(
                    1, timeout=60_000)
            expect(throughput.locator(".scatterlayer .trace")).to_have_count(2 * WORKERS)
            panels = read_panels(dashboard)
            assert sorted(panels) == sorted(PANELS)
            for name, panel in panels.items():
                assert panel["points"] > 0 and "waiting" not in panel["title"], name
            assert len({p["title"] for p in panels.values()}) == len(PANELS)  # titles of their own
            check_layout(panels)
            dashboard.scroll_into_view_if_needed()
            page.screenshot(path=shot("dashboard"), full_page=True)

            # zoom: drag a box on the throughput plot; it must survive two refreshes
            area = throughput.locator(".nsewdrag").first.bounding_box()
            page.mouse.move(area["x"] + 0.3 * area["width"], area["y"] + 0.2 * area["height"])
            page.mouse.down()
            page.mouse.move(area["x"] + 0.6 * area["width"], area["y"] + 0.8 * area["height"],
                            steps=8)
            page.mouse.up()
            zoomed = read_panels(dashboard)["throughput"]
            assert zoomed["autorange"] is False, "the drag did not zoom"
            wait_for_revision(page, "throughput", zoomed["revision"] + 2)
            after = read_panels(dashboard)["throughput"]
            assert after["autorange"] is False
            assert after["xrange"] == pytest.approx(zoomed["xrange"], rel=1e-6, abs=1e-9)
            page.screenshot(path=shot("zoom-kept"), full_page=True)

            dashboard.locator("button", has_text="Pause").click()
            expect(dashboard.locator(".nbdist-status[data-status='paused']")).to_have_count(
                1, timeout=30_000)
            expect(dashboard.locator("button", has_text="Resume")).to_have_count(1)

            dashboard.locator("button", has_text="Stop").click()
            expect(dashboard.locator(".nbdist-status[data-status='stopped']")).to_have_count(
                1, timeout=60_000)
            # the final redraw (and the display's text update) leaves every plot drawn
            dashboard = page.locator(".nbdist-dashboard")
            throughput = dashboard.locator(".nbdist-plot[data-name='throughput']")
            expect(throughput.locator(".scatterlayer .trace")).to_have_count(2 * WORKERS,
                                                                             timeout=30_000)
            check_layout(read_panels(dashboard))
            page.screenshot(path=shot("stopped"), full_page=True)
        except Exception:
            page.screenshot(path=shot("failure"), full_page=True)
            raise
        finally:
            browser.close()


def test_pause_and_stop_act_while_a_wait_cell_blocks_and_the_next_cell_runs_after(jupyter):
    """`%%distribute --wait` blocks its cell (10^5 epochs: it ends when Stop is clicked); the
    dashboard is drawn and its clicks act meanwhile; the cell queued after it runs after it."""
    from playwright.sync_api import expect, sync_playwright

    cells = ["%load_ext nbdist",
             "%%distribute --mode local --epochs 100000 --batch-size 8 --wait\n" + SYNTHETIC_CELL,
             "print('after the wait:', _nbdist_run.status)"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]),
                   jupyter["root"] / "wait.ipynb")
    OUT.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 2200})
        try:
            run_all_cells(page, jupyter, "wait.ipynb")
            dashboard = page.locator(".nbdist-dashboard")
            dashboard.wait_for(timeout=180_000)
            expect(dashboard.locator(".nbdist-status[data-status='running']")).to_have_count(
                1, timeout=60_000)
            wait_for_revision(page, "throughput", 2)  # redrawn during the wait
            dashboard.locator("button", has_text="Pause").click()
            expect(dashboard.locator(".nbdist-status[data-status='paused']")).to_have_count(
                1, timeout=30_000)
            expect(dashboard.locator("button", has_text="Resume")).to_have_count(1)
            after = page.locator(".jp-OutputArea-output", has_text="after the wait:")
            expect(after).to_have_count(0)  # the next cell waits for this one
            dashboard.locator("button", has_text="Stop").click()
            expect(dashboard.locator(".nbdist-status[data-status='stopped']")).to_have_count(
                1, timeout=60_000)
            expect(after).to_have_text("after the wait: stopped", timeout=60_000)
            page.screenshot(path=str(OUT / f"browser-{jupyter['app']}-wait.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(OUT / f"browser-{jupyter['app']}-wait-failure.png"),
                            full_page=True)
            raise
        finally:
            browser.close()


def test_the_html_report_opens_offline_in_chromium_with_every_panel(tmp_path):
    """`run.report()` is one file: with the network cut, every panel still draws."""
    from playwright.sync_api import expect, sync_playwright

    path = fed_run(3, t=8.0).report(tmp_path / "report.html", compare=[fed_run(2, t=5.0)])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        context = browser.new_context(offline=True)
        page = context.new_page()
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        try:
            page.goto(path.resolve().as_uri())
            for panel in ("loss", "throughput", "delay", "delay_histogram", "batch", "nodes",
                          "compare_accuracy_time", "compare_loss_samples", "compare_delay"):
                expect(page.locator(f"#nbdist-{panel}.js-plotly-plot")).to_have_count(
                    1, timeout=30_000)
            expect(page.locator("#nbdist-throughput .legendtext",
                                has_text="worker 2")).to_have_count(1)
            expect(page.locator("#nbdist-nodes .table .y-column").first).to_be_visible()
            compared = page.locator("#nbdist-compare_loss_samples .legendtext")
            expect(compared).to_have_count(2)  # one entry per run, told apart (#1, #2)
            panels = read_panels(page.locator("body"), ".js-plotly-plot")
            check_layout(panels)
            assert [n for n, p in panels.items() if p["points"] == 0] == []
            page.screenshot(path=str(OUT / "browser-report.png"), full_page=True)
        finally:
            browser.close()
    assert [u for u in requests if not u.startswith("file:")] == []  # nothing from a network
