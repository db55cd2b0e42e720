"""Every notebook is committed as a person should find it: valid, without outputs, with one
cell tagged `parameters` that tests/e2e/test_notebooks.py overrides to run it at tiny size."""

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/*.ipynb found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs_and_with_a_parameters_cell(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not [c for c in code if c.get("outputs") or c.get("execution_count")], (
        "clear the outputs")
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and "EPOCHS" in tagged[0].source and "SAMPLES" in tagged[0].source
