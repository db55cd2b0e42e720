"""Every notebook runs top to bottom (tiny size) in a real kernel, as a person would run it
(how each is committed is checked in tests/unit/test_notebook_files.py)."""

from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.notebook

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
# Tiny size: few samples, 1 epoch, 2 workers, short live phases, a one-point sweep. A notebook
# ignores names it does not use; each one's parameter cell says what they mean.
TINY = {"SAMPLES": 2000, "EPOCHS": 1, "WORKERS": 2, "LRS": [0.1], "SECONDS": 3}


def with_parameters(nb, values: dict):
    """Like papermill: a cell after the one tagged `parameters` overrides its values."""
    for i, cell in enumerate(nb.cells):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "\n".join(f"{k} = {v!r}" for k, v in values.items())
            nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
            return nb
    raise AssertionError("the notebook has no cell tagged 'parameters'")


AT_ONCE = 2  # notebooks executing together: much of each is waiting (engines, live phases)


@pytest.fixture(scope="module")
def executions(request):
    """The selected notebooks, executed two at a time in the background, longest first (about
    60% of the time one after the other); each test waits for its own."""
    from concurrent.futures import ThreadPoolExecutor

    chosen = [item.callspec.params["path"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")]
    pool = ThreadPoolExecutor(AT_ONCE, thread_name_prefix="notebook")
    futures = {path: pool.submit(execute, path)
               for path in sorted(chosen, key=lambda p: LONGEST_FIRST.get(p.stem, 0), reverse=True)}
    yield futures
    for future in futures.values():
        future.cancel()
    pool.shutdown(wait=True)


# measured alone (seconds, 2 cores, tiny size): the order the pool takes them in
LONGEST_FIRST = {"05-model-parallel": 90, "03-staleness-lab": 75, "04-heterogeneous-cluster": 73,
                 "02-async-vs-sync": 63, "01-quickstart": 41}


def execute(path: Path):
    """Execute the notebook at tiny size in a fresh kernel, in a folder of its own; return it."""
    import tempfile

    from nbclient import NotebookClient

    nb = with_parameters(nbformat.read(path, as_version=4), TINY)
    with tempfile.TemporaryDirectory(prefix=f"nbdist-{path.stem}-") as folder:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": folder}}).execute()
    return nb


@pytest.mark.cluster  # the notebooks start their own engines
@pytest.mark.slow
# the first test waits while the pool runs the longer notebooks first (about 210 s here): the
# suite's 300 s per test would cut it on a slower machine
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, executions):
    nb = executions[path].result()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    out = Path(__file__).resolve().parents[2] / "out"
    out.mkdir(exist_ok=True)
    nbformat.write(nb, out / f"executed-{path.name}")
