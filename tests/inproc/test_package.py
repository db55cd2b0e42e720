"""Packaging and public surface: light import, sorted public API, pyproject == environment.yml."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nbdist

ROOT = Path(__file__).resolve().parents[2]


def test_import_nbdist_loads_no_heavy_framework():
    code = ("import sys, nbdist; heavy = [m for m in ('tensorflow', 'keras', 'horovod', 'plotly') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_api_is_sorted_and_resolves():
    assert nbdist.__all__ == sorted(nbdist.__all__)
    for name in nbdist.__all__:
        assert getattr(nbdist, name) is not None


def _names(requirements):
    return {re.split(r"[<>=!\[ ]", r.strip(), maxsplit=1)[0].lower(): r.replace(" ", "") for r in requirements}


def test_environment_yml_mirrors_pyproject_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_section = []
    in_pip = False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if line.strip() == "- pip:":
            in_pip = True
        elif in_pip and line.strip().startswith("- "):
            pip_section.append(line.strip()[2:])
    conda = {k: v for k, v in _names(pip_section).items() if not k.startswith("-e")}
    assert conda == _names(project["dependencies"])
    assert "python=3.11" in (ROOT / "environment.yml").read_text()
    assert project["requires-python"] == ">=3.11"


def test_every_error_class_says_what_it_is_for():
    import nbdist.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.NbdistError) and cls.__doc__, name
        assert name in errors.__doc__, f"{name} missing from the tree in errors.py's docstring"


def test_every_exception_class_is_exported_and_drawn_in_the_tree():
    """The errors module's docstring is the map users read: every class must be on it, under
    its parent, and in `__all__` (WorkersLostError was missing from both)."""
    import inspect

    from nbdist import errors

    classes = {name: cls for name, cls in vars(errors).items()
               if inspect.isclass(cls) and issubclass(cls, Exception) and cls.__module__ == errors.__name__}
    assert sorted(errors.__all__) == sorted(classes)
    tree = errors.__doc__
    for name, cls in classes.items():
        assert f" {name} " in tree or f"{name}\n" in tree or f" {name}(" in tree, f"{name} not drawn"
        parent = cls.__bases__[0].__name__
        if parent != "Exception":  # drawn after (under) its parent, indented further
            assert tree.index(f"{parent}") < tree.index(f" {name}"), (name, parent)
