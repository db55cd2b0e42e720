"""What the coordinator records of each push (or sync rank step) for the kernel's views: the
worker's stats row (`stats.RunStats`), its recent staleness (`timeline.DelayWindow`) and a row
of the per-worker timeline. Kept apart from the coordinator's decisions (who does what next):
this only records; of it, the decisions read only the stats rows (DBS and speed groups measure
throughput there). Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbdist.core.speed_groups import SpeedGroups
from nbdist.core.stats import RunStats
from nbdist.core.timeline import DelayWindow, Timeline

if TYPE_CHECKING:
    from nbdist.wire.messages import Report, Step

DELAY_STATS_EVERY = 16  # pushes between refreshes of a worker's delay mean/p95/max (cost)


class PushLog:
    """The records of one run's pushes. `metrics` (`Plan.metrics`): "minimal" keeps only the
    counts and the latest loss; `groups`: the speed groups, whose number goes in each row."""

    def __init__(self, stats: RunStats, metrics: str, groups: SpeedGroups):
        self.stats, self.metrics, self.groups = stats, metrics, groups
        self.timeline = Timeline()
        self.delays = DelayWindow()
        self._delay_stats: dict[int, tuple[float, float, float]] = {}

    def count(self, step: Step | Report, samples: int, batch_size: int, delay: int, now: float,
              epoch: float, slowdown: float) -> None:
        """Record one push or rank step of `samples` at `batch_size`, `delay` versions stale,
        trained under `slowdown`."""
        worker = step.worker
        w = self.stats.workers[worker]
        w.take(step)
        loss = float(step.loss)
        if self.metrics == "minimal":
            w.steps, w.samples, w.loss = w.steps + 1, w.samples + samples, loss
            self.stats.global_step += 1
            return
        compute_s, comm_s = float(step.compute_s), float(step.comm_s)
        self.stats.record_push(worker, samples=samples, loss=loss, compute_s=compute_s,
                               comm_s=comm_s, delay=delay, epoch=epoch, now=now,
                               batch_size=batch_size)
        self.delays.add(worker, delay)
        if w.steps % DELAY_STATS_EVERY == 1 or worker not in self._delay_stats:
            self._delay_stats[worker] = tuple(self.delays.stats(worker).values())  # mean, p95, max
        self.timeline.append_floats(worker, [  # in the order of timeline.DEFAULT_COLUMNS
            now, w.samples_per_s, compute_s, comm_s, float(step.wait_s), float(w.batch_size),
            *self._delay_stats[worker], loss, float(slowdown),
            float(self.groups.index(worker))])
