"""The user's cell in a traceback: its own lines, wherever it ran.

- `compile_cell(source)`: the cell's code, its source registered with `linecache` under
  `CELL_FILENAME`, so a traceback through it quotes the cell's lines (in the kernel and on the
  engines) instead of "Could not get source".
- `cell_errors_shown(tag)`: on an engine, an exception the cell raises is shown (by IPython's
  `showtraceback`, whose text ipyparallel sends to the kernel) as the cell's frames only, from
  its first line on, under a tag naming the engine and its host: what ipyparallel shows for a
  `%%px` cell. The frames above the cell (ipyparallel's, nbdist's) are left out; those below
  it (a helper's, Keras's) stay. The kernel's `RemoteCellError` shows that text.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import socket
import traceback
from collections.abc import Iterator

from nbdist.errors import engine_tag as tag_for

CELL_FILENAME = "<%%distribute cell>"


def compile_cell(source: str):
    """The cell's code object; its lines stay in `linecache` for the tracebacks through it."""
    lines = source.splitlines(keepends=True)
    linecache.cache[CELL_FILENAME] = (len(source), None, lines, CELL_FILENAME)  # mtime None: kept
    return compile(source, CELL_FILENAME, "exec")


def engine_tag() -> str | None:
    """'[engine 3 on node-a]' in an ipyparallel engine; None anywhere else (a notebook's kernel,
    a test process)."""
    try:
        from IPython import get_ipython  # IPython: only in a shell
    except ImportError:
        return None
    engine = getattr(getattr(get_ipython(), "kernel", None), "engine_id", None)
    return None if engine is None else tag_for(engine, socket.gethostname())


@contextlib.contextmanager
def cell_errors_shown(tag: str | None) -> Iterator[None]:
    """Around the cell's `exec`: an exception from the cell leaves with a `_render_traceback_`
    (IPython's hook) that shows the cell's frames under `tag`. No tag (not on an engine), an
    exception that renders itself, or one that takes no attributes: unchanged."""
    try:
        yield
    except Exception as exc:
        if tag is not None and not hasattr(exc, "_render_traceback_"):
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != CELL_FILENAME:
                tb = tb.tb_next
            with contextlib.suppress(AttributeError, TypeError):  # e.g. a class with __slots__
                exc._render_traceback_ = functools.partial(render, tag, exc, tb)
        raise


def render(tag: str, exc: BaseException, tb) -> list[str]:
    """The tag, then `exc` with the frames from `tb` on, as this process's IPython formats a
    traceback (colours included, as ipyparallel's are); plain Python's format without IPython."""
    try:
        from IPython import get_ipython  # IPython: only in a shell

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None:
        text = "\n".join(shell.InteractiveTB.structured_traceback(type(exc), exc, tb))
    else:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    return [tag, *text.splitlines()]
