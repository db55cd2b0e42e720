"""A whole virtual cluster in the kernel on a virtual clock, with real gradients
(`simulation.py`), started by `start.py`; the cost model it uses lives in `nbdist.core.simclock`."""
