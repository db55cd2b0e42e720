"""An exception the user's cell raises on the engines only: the notebook shows the cell's own
lines with their line numbers, under a tag naming the engine and its host, as ipyparallel shows
a `%%px` cell's error; nothing of ipyparallel's or nbdist's frames above the cell.

A real cluster and a real IPython shell: the cell runs in the kernel first (where it does not
raise: `kernel_pid` is this process), then on the engines, where it does."""

import os
import re
import socket

import pytest

from nbdist.errors import RemoteCellError
from tests.helpers import SYNTHETIC_CELL

CELL = SYNTHETIC_CELL.lstrip() + '''
import os

def check(width):
    if os.getpid() != kernel_pid:
        raise ValueError(f"width {width} is not allowed here")
    return width

width = check(16)
'''
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _line(text: str) -> int:
    """The 1-based number of the cell's line that holds `text`, as the traceback numbers it."""
    return next(i for i, line in enumerate(CELL.splitlines(), 1) if text in line)


def _shown(ip, capsys, line: str) -> tuple[BaseException, str]:
    """Run the cell under `%%distribute line` as a notebook does; the error and what it showed."""
    magics = ip.magics_manager.registry["NbdistMagics"]
    ip.user_ns["kernel_pid"] = os.getpid()
    capsys.readouterr()
    result = ip.run_cell(f"%%distribute {line} --no-dashboard -o failing\n{CELL}")
    magics.run = None  # the failed run is over; the next test starts its own
    captured = capsys.readouterr()
    return result.error_in_exec, ANSI.sub("", captured.out + captured.err)


@pytest.mark.parametrize("mode", [
    "async",
    pytest.param("sync", marks=pytest.mark.horovod),
    "pipeline",
])
def test_an_error_on_the_engines_shows_the_cells_own_lines_tagged_with_engine_and_host(
        ip, cluster, capsys, mode):
    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    options = {"async": "--workers 2", "sync": "--mode sync --workers 2",
               "pipeline": "--mode pipeline --stages 2"}[mode]
    error, shown = _shown(ip, capsys, f"{options} --wait")
    assert isinstance(error, RemoteCellError), shown
    host = socket.gethostname()
    assert error.host in (host, None) and error.engine_id in cluster.engine_ids
    lines = [line.rstrip() for line in shown.splitlines()]
    text = "\n".join(lines)
    head = (f"RemoteCellError: The cell raised ValueError on engine {error.engine_id}"
            f"{f' ({host})' if error.host else ''}: width 16 is not allowed here")
    assert lines[0] == head, shown
    assert f"[engine {error.engine_id} on {host}]" in lines  # tagged on the engine itself
    call, raised = _line("width = check(16)"), _line("raise ValueError")
    assert f"File <%%distribute cell>:{call}" in lines
    assert f"File <%%distribute cell>:{raised}, in check(width)" in lines
    assert re.search(rf"^-+> {call} width = check\(16\)$", text, re.M), shown
    assert re.search(rf"^-+> {raised} +raise ValueError\(f\"width ", text, re.M), shown
    assert re.search(rf"^ *{raised - 1} +if os.getpid\(\) != kernel_pid:$", text, re.M)  # context
    assert lines[-1] == "ValueError: width 16 is not allowed here"
    for plumbing in ("ipyparallel", "nbdist/", "run_until_fit", "Could not get source"):
        assert plumbing not in shown, plumbing


def test_the_cells_fit_call_raises_the_engines_error_with_the_cells_lines(ip, cluster, capsys):
    """With a fit call, the error leaves the cell's `model.fit(...)` line in the kernel."""
    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    ip.user_ns["kernel_pid"] = os.getpid()
    cell = CELL + "model.fit(x_train, y_train, epochs=1, verbose=0)\n"
    capsys.readouterr()
    result = ip.run_cell(f"%%distribute --workers 2 --no-dashboard -o failing\n{cell}")
    ip.magics_manager.registry["NbdistMagics"].run = None
    shown = ANSI.sub("", capsys.readouterr().out)
    assert isinstance(result.error_in_exec, RemoteCellError), shown
    assert shown.startswith("RemoteCellError: The cell raised ValueError on engine ")
    assert f"File <%%distribute cell>:{_line('raise ValueError')}, in check(width)" in shown
