"""The Run handle returned by `nbdist.train`: the handle (`handle.py`), its result views
(`views.py`), the control methods (`control.py`), the monitor thread (`monitor.py`) and the
`Backend` protocol every mode's backend implements for it (`backend.py`)."""

from nbdist.run.handle import Run

__all__ = ["Run"]
