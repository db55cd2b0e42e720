"""The calls from `nbdist.train` to the first push the hub applies, traced (in a child process,
`tests/call_path_child.py`, so that every lazy import happens inside the trace): no call goes
up a layer of docs/architecture.md's table by name, and the modules the path passes through
are the list that page shows under "From nbdist.train to the first push"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.call_path_child import HUB, RESULT, WORKER
from tests.unit.test_layering import ARCHITECTURE, documented_layers, layer_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a run in a fresh process, TensorFlow imported there


@pytest.fixture(scope="module")
def traced() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                    "")]))
    done = subprocess.run([sys.executable, "-m", "tests.call_path_child"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=280)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len(RESULT):])
    assert result["pushed"] and result["errors"] == [], result["errors"]
    return result


def traced_path(traced: dict) -> dict[str, list[str]]:
    """The modules in first-call order: the kernel's thread, what the worker adds, the hub's
    stack at the push."""
    kernel = traced["order"]["kernel"]
    worker = [m for m in traced["order"][WORKER] if m not in kernel]
    return {"kernel": kernel, "worker": worker, "hub": traced["hub_stack"]}


def documented_path(text: str | None = None) -> dict[str, list[str]]:
    """The list under "## From nbdist.train to the first push": `label: a → b → ...`, wrapped;
    names relative to the package (`engine.cell` is nbdist.engine.cell, `nbdist` itself)."""
    text = ARCHITECTURE.read_text() if text is None else text
    section = text.split("\n## From nbdist.train to the first push\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 2)[1]
    path: dict[str, list[str]] = {}
    label = None
    for word in re.findall(r"[\w.]+:|[\w.]+", block):
        if word.endswith(":"):
            label = word[:-1]
            path[label] = []
        else:
            path[label].append(word if word == "nbdist" else f"nbdist.{word}")
    return path


def test_the_documented_path_is_read_by_thread():
    text = "\n## From nbdist.train to the first push\n\nx\n```\nkernel: nbdist → api →\n" \
           "        engine.cell\nhub:    core.shard\n```\n\n## Next\n"
    assert documented_path(text) == {"kernel": ["nbdist", "nbdist.api", "nbdist.engine.cell"],
                                     "hub": ["nbdist.core.shard"]}


def test_the_path_reaches_the_push_through_the_hub_and_the_worker(traced):
    path = traced_path(traced)
    assert path["kernel"][:2] == ["nbdist", "nbdist.api"]  # nbdist.train, defined in api.py
    assert path["hub"][0] == "nbdist.hub.server" and path["hub"][-1] == "nbdist.core.shard"
    assert "nbdist.hub.client" in path["worker"]  # the worker's transport sent the push
    assert traced["order"][HUB]  # the hub thread was traced too


def test_the_architecture_page_shows_the_traced_path(traced):
    assert documented_path() == traced_path(traced)


def test_no_call_goes_up_a_layer_by_name(traced):
    """A call from a lower layer's module into a higher one's is allowed only through a value
    the caller was handed (a callback, the `Backend` it was given, an injected clock), never by
    name: no module of a lower layer runs a higher one's body (an import) or calls a function
    it does not hold."""
    layers = documented_layers()
    up = [c for c in traced["calls"] if c["caller"] is not None
          and layer_of(c["callee"], layers) < layer_of(c["caller"], layers)]
    by_name = sorted(f"{c['thread']}: {c['caller']} ({layer_of(c['caller'], layers)}) calls "
                     f"{c['callee']}.{c['qualname']} ({layer_of(c['callee'], layers)})"
                     for c in up if c["module_body"] or not c["held"])
    assert by_name == []
    assert up  # the handed-down calls are seen (the Backend's, the callbacks), so the check bites
