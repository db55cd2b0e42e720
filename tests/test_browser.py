"""The dashboard in a real browser: JupyterLab on loopback, Debian's Chromium driven by
Playwright (never a downloaded browser), the quickstart notebook run as a person would.

Checks, in the page: the dashboard rendered, its plots have a trace per worker, the node
table lists each worker, and clicking Pause makes the run paused (click -> widget comm ->
kernel -> hub -> status poll -> widget -> page). Saves `out/browser-dashboard.png`.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "out"
CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")
WORKERS = 2


def chromium() -> str:
    """Debian's Chromium, installed with apt-get when missing (as root)."""
    found = next((p for p in CHROMIUM if os.access(p, os.X_OK)), None)
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], env=env, check=False,
                       stdout=subprocess.DEVNULL)
        found = next((p for p in CHROMIUM if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.fail("Chromium is not installed and could not be installed here. "
                    "Run `sudo apt-get install chromium` (or `make system` as root).")
    return found


def quickstart_until_the_dashboard(folder: Path) -> Path:
    """The quickstart notebook up to its %%distribute cell, at a size that trains long enough
    to click on (the parameter cell is overridden the way tests/test_notebooks.py does)."""
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


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab on loopback with a token, serving a folder of its own; every kernel it
    started is shut down (and with it the notebook's cluster) before it stops."""
    port, token = free_port(), secrets.token_hex(16)
    settings = tmp_path / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    apputils = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    apputils.mkdir(parents=True)
    (apputils / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    root = tmp_path / "root"
    root.mkdir()
    log = open(tmp_path / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly", *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    api = lambda path, method="GET": urllib.request.urlopen(  # noqa: E731
        urllib.request.Request(f"{base}{path}?token={token}", method=method), timeout=10)
    deadline = time.monotonic() + 60
    while True:
        try:
            api("/api/status")
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((tmp_path / "jupyterlab.log").read_text()[-3000:]) from None
            time.sleep(0.5)
    yield {"base": base, "token": token, "root": root}
    for kernel in json.load(api("/api/kernels")):
        api(f"/api/kernels/{kernel['id']}", method="DELETE")
    server.terminate()
    server.wait(30)
    log.close()
    leftover = _processes_mentioning(str(tmp_path))
    assert not leftover, f"processes left running after JupyterLab stopped: {leftover}"


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
            if proc.name.isdigit() and int(proc.name) != os.getpid() and (text in cmd or text in env):
                found.append(f"{proc.name}: {cmd[:120]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1)


def test_quickstart_dashboard_renders_and_pause_acts_on_the_run(jupyterlab):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    quickstart_until_the_dashboard(jupyterlab["root"])
    OUT.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 2200})
        try:
            page.goto(f"{jupyterlab['base']}/lab/tree/quickstart.ipynb?token={jupyterlab['token']}")
            page.locator(".jp-Notebook").wait_for(timeout=60_000)
            choose = page.locator(".jp-Dialog").get_by_role("button", name="Select")
            try:  # JupyterLab may ask which kernel to start
                choose.click(timeout=10_000)
            except PlaywrightTimeout:
                pass
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1, timeout=60_000)
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()

            dashboard = page.locator(".nbdist-dashboard")
            dashboard.wait_for(timeout=180_000)
            rows = dashboard.locator("table.nbdist-nodes tr.nbdist-node")
            expect(rows).to_have_count(WORKERS, timeout=120_000)
            for w in range(WORKERS):
                expect(rows.nth(w).locator("td").first).to_have_text(str(w))
            throughput = dashboard.locator(".js-plotly-plot").first
            for w in range(WORKERS):  # one legend entry (and trace) per worker
                expect(throughput.locator(".legendtext", has_text=f"worker {w}")).to_have_count(1, timeout=60_000)
            expect(throughput.locator(".scatterlayer .trace")).to_have_count(WORKERS)
            expect(dashboard.locator(".nbdist-status[data-status='running']")).to_have_count(1)

            dashboard.locator("button", has_text="Pause").click()
            expect(dashboard.locator(".nbdist-status[data-status='paused']")).to_have_count(1, timeout=30_000)
            expect(dashboard.locator("button", has_text="Resume")).to_have_count(1)
            dashboard.scroll_into_view_if_needed()
            page.screenshot(path=str(OUT / "browser-dashboard.png"), full_page=True)

            dashboard.locator("button", has_text="Stop").click()
            expect(dashboard.locator(".nbdist-status[data-status='stopped']")).to_have_count(1, timeout=60_000)
            # the final redraw (and the display's text update) leaves every plot drawn
            dashboard = page.locator(".nbdist-dashboard")
            throughput = dashboard.locator(".js-plotly-plot").first
            expect(throughput.locator(".scatterlayer .trace")).to_have_count(WORKERS, timeout=30_000)
            page.screenshot(path=str(OUT / "browser-dashboard-stopped.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(OUT / "browser-dashboard-failure.png"), full_page=True)
            raise
        finally:
            browser.close()


def test_the_html_report_opens_offline_in_chromium_with_every_panel(tmp_path):
    """`run.report()` is one file: with the network cut, every panel still draws."""
    from playwright.sync_api import expect, sync_playwright

    from tests.test_dashboard_widget import fed_run

    path = fed_run(3, t=8.0).report(tmp_path / "report.html")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        context = browser.new_context(offline=True)
        page = context.new_page()
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        try:
            page.goto(path.resolve().as_uri())
            for panel in ("loss", "throughput", "delay", "delay_histogram", "batch", "nodes"):
                expect(page.locator(f"#nbdist-{panel}.js-plotly-plot")).to_have_count(1, timeout=30_000)
            expect(page.locator("#nbdist-throughput .legendtext", has_text="worker 2")).to_have_count(1)
            expect(page.locator("#nbdist-nodes .table .y-column").first).to_be_visible()
            page.screenshot(path=str(OUT / "browser-report.png"), full_page=True)
        finally:
            browser.close()
    assert [u for u in requests if not u.startswith("file:")] == []  # nothing from a network
