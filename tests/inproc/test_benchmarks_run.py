"""Every benchmark starts: its imports resolve and its options parse (`--help`), so a rename in
nbdist cannot leave a benchmark broken until someone runs `make bench`."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted(p for p in (Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py")
                    if not p.name.startswith("_"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_benchmark_imports_and_parses_its_options(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                          timeout=120, cwd=script.parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()


def _nbdist_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from nbdist... import name` in `path`, inside functions too."""
    import ast

    tree = ast.parse(path.read_text())
    return [(node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "nbdist"
            for alias in node.names]


ROOT = Path(__file__).resolve().parents[2]
# helpers (_*.py) too
SCRIPTS = sorted(ROOT.glob("benchmarks/*.py")) + sorted(ROOT.glob("scripts/*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{p.parent.name}/{p.stem}" for p in SCRIPTS])
def test_every_nbdist_name_a_script_imports_exists(script):
    """`--help` runs only the module level: a name imported inside a function (where the heavy
    imports live) would stay broken until the benchmark ran (scale_sim.py did, for a session)."""
    import importlib

    missing = []
    for module, name in _nbdist_imports(script):
        found = importlib.import_module(module)
        if not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"from {module} import {name}")
    assert not missing, f"{script.name} imports names nbdist does not have: {missing}"
