"""Take the README's dashboard screenshot (docs/images/dashboard.png) the way a person sees it:
JupyterLab on loopback, Debian's Chromium driven by Playwright (tests/e2e/test_browser.py's
machinery), notebooks/01-quickstart.ipynb run top to bottom on its own 3-engine cluster at
--epochs EPOCHS on SAMPLES images, and the dashboard photographed once the run has finished.

    python scripts/dashboard_screenshot.py                  # writes docs/images/dashboard.png
    python scripts/dashboard_screenshot.py --out /tmp/d.png --epochs 2 --samples 6000

Needs `make system` (Chromium) and the dev extra (JupyterLab, Playwright); trains for about a
minute on 2 cores. Every process it starts (the server, its kernel, the kernel's cluster) is
stopped before it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.test_browser import APPS, chromium, free_port, run_all_cells  # noqa: E402
from tests.helpers import wait_for  # noqa: E402

# px: the page's width, as on a laptop screen (the notebook's area, the sidebar closed)
WIDTH = 1280


def notebook(folder: Path, epochs: int, samples: int | None) -> str:
    """The quickstart with its parameters set and its `run.wait()` cell last (so the page
    keeps the dashboard of a finished run)."""
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "01-quickstart.ipynb", as_version=4)
    waits = next(i for i, c in enumerate(nb.cells) if c.source.startswith("run.wait()"))
    nb.cells = nb.cells[:waits]
    tagged = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(tagged + 1,
                    nbformat.v4.new_code_cell(f"EPOCHS = {epochs}\nSAMPLES = {samples}"))
    nbformat.write(nb, folder / "quickstart.ipynb")
    return "quickstart.ipynb"


@contextlib.contextmanager
def jupyterlab(folder: Path):
    """A JupyterLab server on loopback serving `folder`; its kernels are shut down (and with
    them their clusters) before it stops."""
    module, tree, flags = APPS["jupyterlab"]
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "IPYTHONDIR": str(folder / "ipython"),
           "JUPYTERLAB_SETTINGS_DIR": str(folder / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(folder / "workspaces"),
           "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for extension, name, setting in (("notebook-extension", "tracker", {"windowingMode": "none"}),
                                     ("apputils-extension", "notification",
                                      {"fetchNews": "false"})):
        settings = folder / "settings" / "@jupyterlab" / extension
        settings.mkdir(parents=True, exist_ok=True)
        (settings / f"{name}.jupyterlab-settings").write_text(json.dumps(setting))
    (folder / "root").mkdir()
    log = open(folder / "jupyterlab.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", module, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder / 'root'}", *flags,
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def api(path: str, method: str = "GET"):
        request = urllib.request.Request(  # noqa: S310 - the local Jupyter server's http URL
            f"{base}{path}?token={token}", method=method)
        return urllib.request.urlopen(request, timeout=10)  # noqa: S310 - our own loopback server

    def answers() -> bool:
        if server.poll() is not None:
            raise SystemExit((folder / "jupyterlab.log").read_text()[-3000:])
        with contextlib.suppress(OSError):
            return api("/api/status").status == 200
        return False

    try:
        wait_for(answers, timeout=60, poll_s=0.5, what="JupyterLab's answer")
        yield {"root": folder / "root", "api": api,
               "url": lambda name: f"{base}{tree.format(name=name)}?token={token}"}
    finally:
        with contextlib.suppress(OSError):
            for kernel in json.load(api("/api/kernels")):
                api(f"/api/kernels/{kernel['id']}", method="DELETE")
        server.terminate()
        server.wait(30)
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.png")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples", type=int, default=None, help="default: all 60,000 images")
    args = parser.parse_args()
    from playwright.sync_api import expect, sync_playwright

    with tempfile.TemporaryDirectory(prefix="nbdist-shot-") as tmp, jupyterlab(Path(tmp)) as lab:
        name = notebook(lab["root"], args.epochs, args.samples)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": WIDTH, "height": 2400})
            try:
                run_all_cells(page, lab, name)
                # the file browser closed: the notebook's full width
                page.keyboard.press("Control+b")
                dashboard = page.locator(".nbdist-dashboard")
                dashboard.wait_for(timeout=180_000)
                finished = dashboard.locator(".nbdist-status[data-status='finished']")
                expect(finished).to_have_count(1, timeout=900_000)
                page.wait_for_timeout(3000)  # the final redraw of every panel
                args.out.parent.mkdir(parents=True, exist_ok=True)
                dashboard.screenshot(path=str(args.out))
            finally:
                browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
