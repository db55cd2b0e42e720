"""The package layout's promises, checked on the source: the core stays pure."""

import ast
import sys
from pathlib import Path

NBDIST = Path(__file__).resolve().parents[2] / "nbdist"
PURE = ("core", "algorithms")
ALLOWED_NBDIST = ("nbdist.core", "nbdist.algorithms", "nbdist.errors", "nbdist.config",
                  "nbdist.choices",  # the options' enums: plain strings
                  "nbdist.env",  # the NBDIST_* switches, read from os.environ
                  "nbdist._kernels",  # the compiled update kernel: C over buffers, no I/O
                  "nbdist.wire")  # the typed messages: dataclasses


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module and not n.level}


def test_the_core_and_the_rules_import_numpy_and_the_standard_library_only():
    """No sockets, threads, TensorFlow or ipyparallel in the pure core: it is tested with
    exact values."""
    paths = [p for pkg in PURE for p in sorted((NBDIST / pkg).glob("*.py"))]
    paths += sorted((NBDIST / "wire").glob("*.py"))  # what the core reads and answers
    assert len(paths) > 20
    for path in paths:
        for name in _imports(path):
            top = name.split(".")[0]
            if top == "nbdist":
                assert name.startswith(ALLOWED_NBDIST), f"{path.name} imports {name}"
            else:
                assert top == "numpy" or (top in sys.stdlib_module_names
                                          and top not in {"socket", "threading", "subprocess"}), \
                    f"{path.relative_to(NBDIST)} imports {name}: the core must stay pure"


def test_every_test_file_has_a_name_of_its_own():
    """pytest imports test files by their base name (the tiers have no __init__.py): two files
    of one name in two tiers stop `make test` from collecting either."""
    tests = NBDIST.parent / "tests"
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
