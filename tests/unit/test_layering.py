"""The layering reads top-down, as docs/architecture.md's table of layers draws it: every
import of the package (at a module's top, inside a function or under TYPE_CHECKING) goes to its
own layer or one below, never above, and no module imports itself back round a cycle. The
modes share only what lies below them, the Run never reaches up into a mode, and every mode's
backend implements the whole `Backend` protocol."""

import ast
import inspect
import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "nbdist"
MODES_DIR = ROOT / "modes"
ARCHITECTURE = ROOT.parent / "docs" / "architecture.md"


# -- the package's own import graph ------------------------------------------------------------


def package_modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """Every module of the package by dotted name: its .py files (a package by its __init__) and
    its compiled extensions (a .c file at the package's top, built as `nbdist._kernels`)."""
    modules = {}
    for path in [*root.rglob("*.py"), *root.glob("*.c")]:
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(module: str, source: str, is_package: bool, modules) -> set[str]:
    """The package's modules that `source` (the module `module`) imports, anywhere in it:
    `from P import name` is P.name where that is a module, else P; relative imports resolved.
    """
    found = set()
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # `import a.b.c`: the deepest module there is
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """module -> the package's modules it imports."""
    modules = package_modules(root)
    return {m: imports_of(m, p.read_text(), p.name == "__init__.py", modules)
            if p.suffix == ".py" else set() for m, p in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan), each an import
    cycle."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def documented_layers(text: str | None = None) -> list[tuple[str, ...]]:
    """The layers, top first, from the table under "## The layers" in docs/architecture.md: each
    row's first cell names its modules (`api.py`, `fit/launch.py`, `hub/`, `modes/<mode>/`,
    `__init__.py` for the package itself), as dotted prefixes; `modes/<mode>/` names the
    subpackages only ("nbdist.modes."), `modes/__init__.py` the package itself."""
    text = ARCHITECTURE.read_text() if text is None else text
    section = text.split("\n## The layers\n", 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in section.splitlines():
        cells = line.split("|")
        if not line.startswith("| `") or len(cells) < 3:
            continue
        prefixes = []
        for path in re.findall(r"`([^`]+)`", cells[1]):
            children = "<mode>/" in path
            path = path.replace("<mode>/", "").removesuffix("/").removesuffix(".py")
            path = path.removesuffix(".c").removesuffix("__init__").removesuffix("/")
            prefix = ".".join(["nbdist", *filter(None, path.split("/"))])
            prefixes.append(prefix + "." if children else prefix)
        layers.append(tuple(prefixes))
    return layers


def layer_of(module: str, layers: list[tuple[str, ...]]) -> int | None:
    """The row (0: the top) whose longest prefix names `module`; the package itself only by
    its own name, so a module the table leaves out has no layer."""
    best = None
    for row, prefixes in enumerate(layers):
        for prefix in prefixes:
            if prefix.endswith("."):  # the subpackages alone
                named = module.startswith(prefix)
            else:
                named = module == prefix or prefix != "nbdist" and module.startswith(prefix + ".")
            if named and (best is None or len(prefix) > len(best[1])):
                best = (row, prefix)
    return None if best is None else best[0]


def test_the_graph_finds_every_kind_of_import():
    import textwrap

    modules = {"nbdist", "nbdist.hub", "nbdist.hub.shm", "nbdist.hub.server", "nbdist.wire",
               "nbdist.wire.messages", "nbdist.errors", "nbdist.run", "nbdist.run.handle",
               "nbdist._kernels"}
    source = textwrap.dedent("""
        from typing import TYPE_CHECKING
        import numpy
        from nbdist.hub import shm
        from . import server
        from ..wire.messages import Step
        if TYPE_CHECKING:
            from nbdist.run.handle import Run
        def f():
            import nbdist._kernels as k
            from nbdist.errors import ConfigError
    """)
    assert imports_of("nbdist.hub.client", source, False, modules) == {
        "nbdist.hub.shm", "nbdist.hub.server", "nbdist.wire.messages", "nbdist.run.handle",
        "nbdist._kernels", "nbdist.errors"}
    assert imports_of("nbdist.hub", "from .shm import host", True, modules) == {"nbdist.hub.shm"}


def test_cycles_are_found_and_a_tree_has_none():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert import_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_itself_back_round_a_cycle():
    """A cycle hides the graph's order and breaks on a changed import order; a pair of modules
    that need each other is one concept split in two."""
    cycles = import_cycles(import_graph())
    assert cycles == []


def test_the_layers_are_read_from_the_architecture_page_top_first():
    layers = documented_layers()
    assert layers[0] == ("nbdist", "nbdist.api", "nbdist.magic", "nbdist.fit.launch",
                         "nbdist.sweeps")
    assert layers[-1] == ("nbdist.errors", "nbdist.env")
    assert ("nbdist.wire",) in layers and layers.index(("nbdist.wire",)) == len(layers) - 2
    assert layer_of("nbdist.modes.common.worker", layers) == 2  # below modes/<mode>/
    assert layer_of("nbdist.modes.sync.rank", layers) == 1
    assert layer_of("nbdist.fit.launch", layers) == 0 and layer_of("nbdist.fit.plan", layers) == 4
    assert layer_of("nbdist.not_in_the_table", layers) is None  # not the package's own row


def test_every_module_has_a_layer_in_the_architecture_page():
    layers = documented_layers()
    assert sorted(m for m in import_graph() if layer_of(m, layers) is None) == []


def test_no_import_runs_up_a_layer():
    """Every import of every module (top, function or TYPE_CHECKING) goes to its own row of the
    table or one below. Within a row, packages may use each other; the cycle test keeps that a
    tree."""
    layers = documented_layers()
    upward = sorted(f"{m} ({layer_of(m, layers)}) imports {t} ({layer_of(t, layers)})"
                    for m, targets in import_graph().items() for t in targets
                    if layer_of(t, layers) < layer_of(m, layers))
    assert upward == []


def test_the_wire_imports_only_the_exception_tree():
    """The sockets' vocabulary sits at the bottom: the core, the hub, the checkpoints and the
    workers all speak it, so it may import none of them."""
    graph = import_graph()
    wire = {t for m, targets in graph.items() if m.startswith("nbdist.wire")
            for t in targets if not t.startswith("nbdist.wire")}
    assert wire == {"nbdist.errors"}


def imported_modules(source: str) -> set[str]:
    """Every module `source` imports, at its top or inside a function, as a dotted name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def mode_package(module: str) -> str | None:
    """The package under nbdist.modes that `module` is in (`nbdist.modes.sync.rank` -> `sync`)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["nbdist", "modes"] else None


def mode_packages() -> set[str]:
    from nbdist.modes import MODES

    return {mode_package(entry.module) for entry in MODES.values()}


def test_the_parser_finds_imports_at_the_top_and_inside_functions():
    import textwrap

    source = textwrap.dedent("""
        from nbdist.modes.async_ps.backend import ClusterBackend
        import nbdist.modes.sync.rank
        def f():
            from nbdist.modes import local
    """)
    packages = {mode_package(m) for m in imported_modules(source)}
    assert packages == {None, "async_ps", "sync", "local"}


def test_every_mode_is_a_package_and_common_is_none_of_them():
    packages = mode_packages()
    assert packages == {"async_ps", "local", "sync", "simulate", "pipeline"}
    assert all((MODES_DIR / p / "__init__.py").is_file() for p in packages)
    assert "common" not in packages and (MODES_DIR / "common" / "__init__.py").is_file()


@pytest.mark.parametrize("package", sorted(mode_packages()) + ["common"])
def test_no_mode_package_imports_another_and_common_imports_none(package):
    crossing = {f"{path.relative_to(ROOT.parent)} imports {module}"
                for path in (MODES_DIR / package).rglob("*.py")
                for module in imported_modules(path.read_text())
                if mode_package(module) not in (None, package, "common")}
    assert crossing == set()


def test_nothing_below_the_modes_imports_them_only_the_api_picks_one():
    """The Run, the hub, the engine side, the core: none imports a mode's package (the modes
    import them). `nbdist.api` looks the mode up in the MODES table. The table itself
    (`nbdist.modes`, the modes' specs: plain data) is read by anything that differs by mode."""
    packages = mode_packages() | {"common"}
    upward = {f"{path.relative_to(ROOT.parent)} imports {module}"
              for path in ROOT.rglob("*.py") if MODES_DIR not in path.parents
              and path != ROOT / "api.py"
              for module in imported_modules(path.read_text()) if mode_package(module) in packages}
    assert upward == set()


def test_the_modes_table_stays_plain_data_on_the_standard_library():
    """`import nbdist` loads it (nbdist.config reads the specs): it imports no mode package."""
    source = (MODES_DIR / "__init__.py").read_text()
    assert {m for m in imported_modules(source) if m.startswith("nbdist")} <= {
        "nbdist.errors", "nbdist.errors.ConfigError", "nbdist.errors.NoClusterError"}


def backends() -> dict:
    """Each mode's backend class, by mode."""
    from nbdist.modes.async_ps.backend import ClusterBackend
    from nbdist.modes.local.backend import LocalBackend
    from nbdist.modes.pipeline.runtime import PipelineBackend
    from nbdist.modes.simulate.start import SimBackend
    from nbdist.modes.sync.backend import SyncBackend

    return {"async": ClusterBackend, "local": LocalBackend, "sync": SyncBackend,
            "simulate": SimBackend, "pipeline": PipelineBackend}


def test_every_mode_has_a_backend_here():
    from nbdist.modes import MODES

    assert set(backends()) == set(MODES)


def test_the_protocol_lists_what_the_starts_and_the_run_use():
    from nbdist.run.backend import Backend

    methods = {n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_")}
    assert methods >= {"start_hubs", "start_workers", "hub_places", "current_weights", "failure",
                       "newly_lost", "workers_running", "final_params", "checkpoint_state",
                       "add_workers", "joined_engines", "finish", "written_off", "worker_results"}
    assert set(Backend.__annotations__) == {"num_workers", "cluster"}


@pytest.mark.parametrize("mode", sorted(backends()))
def test_every_backend_implements_the_whole_protocol_itself_with_its_signatures(mode):
    """Not inherited from the protocol's empty stubs, which would return None silently."""
    from nbdist.run.backend import Backend

    backend = backends()[mode]
    assert Backend in backend.__mro__  # says so explicitly
    methods = [n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_")]
    for name in [*methods, "num_workers", "cluster"]:
        owner = next((c for c in backend.__mro__
                      if name in vars(c) or name in getattr(c, "__annotations__", {})), None)
        assert owner is not None and owner is not Backend, f"{backend.__name__} lacks {name}"
    for name in methods:
        want = list(inspect.signature(getattr(Backend, name)).parameters)
        got = list(inspect.signature(getattr(backend, name)).parameters)
        assert got == want, f"{backend.__name__}.{name}{got} differs from the protocol's {want}"


def test_a_pipeline_on_engines_without_a_fit_call_refuses_current_weights_saying_why():
    from types import SimpleNamespace

    from nbdist.errors import ConfigError
    from nbdist.modes.pipeline.runtime import PipelineBackend

    control = SimpleNamespace(tasks_done=None)
    on_engines = PipelineBackend(object(), [1, 2], None, None, {}, control)
    refusal = (r"hands out its weights at the epoch ends of a cell's fit call only \(Received: .*"
               r"engines \[1, 2\], from a cell without one\).*run\.model.*model\.fit")
    with pytest.raises(ConfigError, match=refusal):
        on_engines.current_weights(control)
    assert control.tasks_done == on_engines.tasks_done  # the control asks the backend's tasks


def test_the_hubless_backends_refuse_to_start_hubs_and_place_none():
    from nbdist.errors import TrainingError
    from nbdist.modes.pipeline.runtime import PipelineBackend
    from nbdist.modes.simulate.start import SimBackend

    pipeline = PipelineBackend(None, [0], None, None, {}, type("C", (), {})())
    simulated = SimBackend.__new__(SimBackend)
    for backend in (pipeline, simulated):
        with pytest.raises(TrainingError, match=r"Received: 2 hub spec\(s\).*start_workers\(\)"):
            backend.start_hubs([object(), object()])
        assert backend.hub_places([{"tcp": "tcp://127.0.0.1:1"}]) == []


def test_the_shared_hub_specs_slice_the_parameters_and_keep_state_on_shard_0():
    from nbdist.hub.server import HubSpec
    from nbdist.modes.common.launch import hub_specs

    base = HubSpec(run_id="r", key=b"k" * 32, shard=0, num_shards=1, plan=None,
                   params=np.zeros(0, np.float32), non_trainable=np.ones(3, np.float32))
    specs = hub_specs(base, np.arange(5, dtype=np.float32), 2)
    assert [s.params.tolist() for s in specs] == [[0.0, 1.0], [2.0, 3.0, 4.0]]
    assert [s.offset for s in specs] == [0, 2] and [s.shard for s in specs] == [0, 1]
    assert specs[0].non_trainable.tolist() == [1.0, 1.0, 1.0] and specs[1].non_trainable.size == 0


def test_worker_results_are_the_values_of_the_tasks_that_returned():
    from types import SimpleNamespace

    from nbdist.config import TrainConfig
    from nbdist.run.backend import returned
    from nbdist.run.handle import Run

    def task(value=None, ready=True, ok=True):
        return SimpleNamespace(ready=lambda: ready, successful=lambda: ok,
                               get=lambda timeout: value)

    tasks = {0: task({"steps": 3}), 1: task(ready=False), 2: task(ok=False), 3: task({"steps": 4})}
    assert returned(tasks) == {0: {"steps": 3}, 3: {"steps": 4}}  # running and failed left out
    assert returned([task("a"), task(ready=False)]) == {0: "a"}  # a list: ids are its indices
    assert Run(TrainConfig(), model=None, model_name="model").worker_results == {}  # not begun
