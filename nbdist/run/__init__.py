"""The Run handle returned by `nbdist.train`: the handle (`handle.py`), its result views
(`views.py`), the control methods (`control.py`) and the monitor thread (`monitor.py`)."""

from nbdist.run.handle import Run

__all__ = ["Run"]
