"""The Run handle returned by `nbdist.train`: the handle (`handle.py`) over one explicit state
(`state.py`), its result views (`views.py`), the control methods (`control.py`), the monitor
thread (`monitor.py`), workers added mid-run (`elastic.py`), a cell's wait for its run with the
dashboard kept live (`live_wait.py`) and the `Backend` protocol every mode's backend implements
for it (`backend.py`). It imports no mode: the modes import it."""

from nbdist.run.handle import Run

__all__ = ["Run"]
