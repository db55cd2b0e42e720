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
    return {re.split(r"[<>=!\[ ]", r.strip(), maxsplit=1)[0].lower(): r.replace(" ", "")
            for r in requirements}


def _conda_pip_section(name: str) -> dict[str, str]:
    pip_section = []
    in_pip = False
    for line in (ROOT / name).read_text().splitlines():
        if line.strip() == "- pip:":
            in_pip = True
        elif in_pip and line.strip().startswith("- "):
            pip_section.append(line.split("#")[0].strip()[2:])
    return {k: v for k, v in _names(pip_section).items() if not k.startswith("-e")}


def test_environment_yml_mirrors_pyproject_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _conda_pip_section("environment.yml") == _names(project["dependencies"])
    # GPU nodes: the same, with the gpu extra (TensorFlow with CUDA replaces TensorFlow)
    gpu = {**_names(project["dependencies"]), **_names(project["optional-dependencies"]["gpu"])}
    assert _conda_pip_section("environment-gpu.yml") == gpu
    for name in ("environment.yml", "environment-gpu.yml"):
        assert "python=3.11" in (ROOT / name).read_text()
    assert project["requires-python"] == ">=3.11"


def test_the_gpu_extra_upgrades_the_one_tensorflow_and_nothing_can_shadow_it():
    """`pip install "nbdist[gpu]"` must end with one TensorFlow distribution, CUDA-enabled: the
    gpu extra names the base dependency's distribution (`tensorflow`) with its CUDA extra and
    the same versions, and no requirement anywhere names `tensorflow-cpu`, which pip would
    install beside it into the same `tensorflow` folder."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _names(project["dependencies"])["tensorflow"]
    gpu = _names(project["optional-dependencies"]["gpu"])["tensorflow"]
    assert gpu == base.replace("tensorflow", "tensorflow[and-cuda]", 1)
    everything = [*project["dependencies"], *sum(project["optional-dependencies"].values(), [])]
    # the yml files mirror these
    assert not [r for r in everything if r.lower().startswith("tensorflow-cpu")]


def test_the_backend_extras_take_cpu_builds_and_every_install_names_them():
    """`nbdist[jax]` and `nbdist[torch]`: JAX without a CUDA extra, PyTorch pinned to one release
    (an open `torch` requirement pulls PyPI's multi-GB CUDA build); environment.yml and the
    Makefile's install step (what `make test` and CI install) take both, the Makefile PyTorch's
    CPU build of the same pin first."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(_names(extras["jax"])) == {"jax", "jaxlib"}
    assert not [r for r in extras["jax"] if "[" in r]  # no jax[cuda...]
    assert list(_names(extras["torch"]).values()) == ["torch==2.13.0"]
    installed = re.search(r"-e \.\[([\w,]+)\]",
                          (ROOT / "environment.yml").read_text()).group(1).split(",")
    make = re.search(r"^EXTRAS \?= (\S+)$", (ROOT / "Makefile").read_text(),
                     re.M).group(1).split(",")
    for names in (installed, make):
        assert {"dev", "jax", "torch"} <= set(names)
        assert set(names) <= set(extras)
    pin = re.search(r"^TORCH_PIN\s*:= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert [pin] == extras["torch"]


def test_every_error_class_says_what_it_is_for():
    import nbdist.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.NbdistError) and cls.__doc__, name
        assert name in errors.__doc__, f"{name} missing from the tree in errors.py's docstring"


def drawn_tree(doc: str) -> dict[str, tuple[str | None, str | None]]:
    """{class name: (the class drawn above it, the built-in named after it)} read from the
    box-drawing tree in a docstring: four columns per level."""
    drawn, stack = {}, []
    for line in doc.splitlines():
        found = re.search(r"\b(\w+Error)\b(?: \((\w+)\))?", line)
        if not found or not re.fullmatch(r"[ │├└─]*", line[:found.start()]):
            continue
        depth = found.start() // 4
        del stack[depth - 1:]
        drawn[found[1]] = (stack[-1] if stack else None, found[2])
        stack.append(found[1])
    return drawn


def test_every_exception_class_is_exported_and_drawn_in_the_tree_under_its_parent():
    """The errors module's docstring is the map users read: every class must be on it, under
    its own parent, and in `__all__` (WorkersLostError was missing from both)."""
    import inspect

    from nbdist import errors

    classes = {name: cls for name, cls in vars(errors).items()
               if inspect.isclass(cls) and issubclass(cls, Exception)
               and cls.__module__ == errors.__name__}
    assert sorted(errors.__all__) == sorted(classes)
    tree = drawn_tree(errors.__doc__)
    assert sorted(tree) == sorted(classes), "the tree draws other classes than errors.py defines"
    for name, cls in classes.items():
        parent, builtin = tree[name]
        own = [b.__name__ for b in cls.__bases__ if b.__module__ == errors.__name__]
        assert [parent] == (own or [None]), f"{name} is drawn under {parent}, its parent is {own}"
        if builtin is not None:
            assert builtin in [b.__name__ for b in cls.__mro__], f"{name} is no {builtin}"


def test_the_tree_reader_sees_a_class_drawn_under_the_wrong_parent():
    doc = """
    NbdistError
    ├── TrainingError (RuntimeError)        the run failed
    └── CheckpointError (ValueError)        a checkpoint is corrupt
        └── WorkersLostError                every worker was lost
"""
    assert drawn_tree(doc) == {"NbdistError": (None, None),
                               "TrainingError": ("NbdistError", "RuntimeError"),
                               "CheckpointError": ("NbdistError", "ValueError"),
                               "WorkersLostError": ("CheckpointError", None)}
