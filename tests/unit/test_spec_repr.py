"""The run key never shows in a `repr`: the specs that carry it (to a hub, a worker, a sync rank,
a pipeline stage) print everything else, so a spec in a log line, a traceback or a notebook
cell's output gives away nothing that signs messages."""

import ast
import dataclasses
from pathlib import Path

import pytest

from nbdist.hub.server import HubSpec
from nbdist.modes.common.worker import WorkerSpec
from nbdist.modes.pipeline.stage import StageSpec
from nbdist.modes.sync.rank import SyncSpec

ROOT = Path(__file__).resolve().parents[2] / "nbdist"
SECRET = bytes(range(200, 232))  # 32 bytes, like a run key
SECRET_NAMES = ("key", "secret", "curve", "password", "token")


def secret_field(name: str) -> bool:
    """A field whose name says it holds key material (`key`, `curve_secret`, `server_key`...)."""
    name = name.lower()
    return any(word in name.split("_") or name.endswith(word) for word in SECRET_NAMES)


def dataclass_fields_in_source() -> list[tuple[str, str, str, ast.AnnAssign]]:
    """(file, class, field, node) for every field of every @dataclass under nbdist/."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef) or not any(
                    "dataclass" in ast.unparse(d) for d in node.decorator_list):
                continue
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    where = str(path.relative_to(ROOT.parent))
                    found.append((where, node.name, item.target.id, item))
    return found


def test_every_dataclass_field_holding_key_material_is_left_out_of_repr():
    fields = dataclass_fields_in_source()
    assert len(fields) > 100  # the scan sees the package's dataclasses
    secret = [(f, c, n, node) for f, c, n, node in fields if secret_field(n)]
    expected = {("HubSpec", "key"), ("WorkerSpec", "key"), ("StageSpec", "key")}
    assert {(c, n) for _, c, n, _ in secret} >= expected
    shown = [f"{file}: {cls}.{name}" for file, cls, name, node in secret
             if "repr=False" not in ast.unparse(node.value or ast.Constant(None)).replace(" ", "")]
    assert not shown, f"key material printed by repr (declare it with field(repr=False)): {shown}"


def filled(cls):
    """An instance of dataclass `cls` with every field set (none validated): the key to SECRET,
    the rest to a placeholder."""
    spec = object.__new__(cls)
    for f in dataclasses.fields(cls):
        object.__setattr__(spec, f.name, SECRET if secret_field(f.name) else f"<{f.name}>")
    return spec


@pytest.mark.parametrize("cls", [HubSpec, WorkerSpec, SyncSpec, StageSpec])
def test_a_spec_repr_shows_its_fields_but_not_the_key(cls):
    text = repr(filled(cls))
    assert "<run_id>" in text  # the rest is still there to read
    for form in (repr(SECRET), SECRET.hex(), str(list(SECRET))):
        assert form not in text
    assert "key=" not in text
