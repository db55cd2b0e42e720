"""Sweeps: one cell over a grid of options, and the table of time and bytes to a target
(`nbdist.sweep(...)`; the runner is `nbdist.sweeps.runner`, its arithmetic
`nbdist.sweeps.table`)."""

from nbdist.sweeps.runner import SweepResult, sweep

__all__ = ["SweepResult", "sweep"]
