"""Per-worker counters and the run's history, kept by the coordinating hub shard.

Pure bookkeeping on plain Python numbers; `snapshot()` is what the kernel's Run polls (as
JSON). History rows are returned incrementally (`since=`), so a poll costs only what is new.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from nbdist.wire.messages import Hello, Report, Step

HISTORY_COLUMNS = ("time", "step", "epoch", "worker", "loss", "delay", "batch_size")
EMA_WEIGHT = 0.2  # weight of the newest step in the samples/s moving average


@dataclass
class WorkerStats:
    """What the hub knows about one worker (one row of `run.nodes`)."""

    worker: int
    state: str = "starting"  # starting, running, paused, waiting, done, lost
    steps: int = 0
    samples: int = 0
    samples_per_s: float = 0.0  # moving average of batch / compute time (compute only)
    compute_s: float = 0.0  # total time spent computing gradients
    comm_s: float = 0.0  # total time spent in push/pull round trips
    delay_sum: int = 0
    delay_max: int = 0
    batch_size: int = 0
    loss: float = math.nan
    host: str = ""
    engine: int | None = None
    link: str = ""  # "tcp" or "shm" (shared memory: only headers cross ZeroMQ)
    # bytes sent, received: over TCP, over shm's sockets, the weight and gradient frames, and
    # the float32 arrays those frames stand for (WorkerTransport.traffic)
    traffic: list = field(default_factory=lambda: [0] * 8)
    compression: str = "none"  # the codec of its frames (nbdist.core.compression): TCP only
    gpu: str | None = None  # name, memory total at hello; utilisation %, memory used every few s
    gpu_mem_total: int | None = None
    gpu_util: int | None = None
    gpu_mem: int | None = None
    hellos: int = 0  # processes of it that said hello (more than one: restarted, or rejoined)

    @property
    def delay_mean(self) -> float:
        return self.delay_sum / self.steps if self.steps else 0.0

    def hello(self, hello: Hello) -> None:
        """What a worker says of itself at hello: where it runs, its link and GPU."""
        self.state, self.host, self.engine = "starting", hello.host, hello.engine
        self.hellos += 1
        self.link, self.gpu, self.gpu_mem_total = hello.link, hello.gpu, hello.gpu_mem_total
        self.compression = hello.compression if hello.link == "tcp" else "none"

    def take(self, step: Step | Report) -> None:
        """A push's running byte totals (every push) and GPU reading (every few s)."""
        if step.traffic is not None:
            self.traffic = step.traffic
        if step.gpu_util is not None:
            self.gpu_util, self.gpu_mem = step.gpu_util, step.gpu_mem

    def to_row(self) -> dict:
        row = asdict(self)
        row.pop("traffic")
        row.update(delay_mean=self.delay_mean, **traffic_row(self.traffic))
        return row


def traffic_row(traffic: list) -> dict:
    """A worker's byte totals by name. `compression_ratio` is its weight and gradient frames'
    bytes over those of the float32 arrays they carry (NaN before its first TCP frame).

    Example:
        >>> row = traffic_row([300, 500, 0, 0, 250, 450, 1000, 1000])
        >>> row["bytes_sent"], row["tcp_bytes"], row["compression_ratio"]
        (300, 800, 0.35)
    """
    counts = list(traffic) + [0] * (8 - len(traffic))  # a sync rank's Report: 4
    tcp_sent, tcp_received, shm_sent, shm_received = counts[:4]
    frames_sent, frames_received, float32_sent, float32_received = counts[4:]
    float32 = float32_sent + float32_received
    return dict(bytes_sent=tcp_sent + shm_sent, bytes_received=tcp_received + shm_received,
                tcp_bytes=tcp_sent + tcp_received, shm_bytes=shm_sent + shm_received,
                frame_bytes=frames_sent + frames_received, float32_bytes=float32,
                compression_ratio=(frames_sent + frames_received) / float32 if float32
                else math.nan)


class Completed(NamedTuple):
    """What `Coordinator.complete` read of a push for its `account` (which may come later, in
    a batch): its samples, its batch size, the split a rebalance set (None: none), the epochs
    done then, the epochs it ended."""

    samples: int
    batch_size: int
    rebalanced: list[int] | None
    epoch: float
    ended: list[int]


@dataclass
class RunStats:
    """Counters for every worker plus the step-by-step history.

    Example:
        >>> s = RunStats(num_workers=1)
        >>> s.record_push(0, samples=32, loss=0.5, compute_s=0.01, comm_s=0.001, delay=0,
        ...               epoch=0.1, now=1.0)
        >>> s.snapshot(since=0)["history"]
        [[1.0, 1, 0.1, 0, 0.5, 0, 32]]
    """

    num_workers: int
    start_time: float = 0.0
    global_step: int = 0
    workers: list[WorkerStats] = field(default_factory=list)
    history: list[list] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.workers:
            self.workers = [WorkerStats(worker=i) for i in range(self.num_workers)]

    def add_worker(self, engine: int | None = None) -> WorkerStats:
        """A row for a worker added mid-run (the next id), "starting" until it says hello."""
        row = WorkerStats(worker=len(self.workers), engine=engine)
        self.workers.append(row)
        self.num_workers = len(self.workers)
        return row

    def record_push(self, worker: int, *, samples: int, loss: float, compute_s: float,
                    comm_s: float, delay: int, epoch: float, now: float,
                    batch_size: int | None = None) -> None:
        """Count one applied push and append its history row. `samples` may be less than the
        assigned `batch_size` for the last chunk of an epoch."""
        self.global_step += 1
        w = self.workers[worker]
        w.steps += 1
        w.samples += samples
        w.compute_s += compute_s
        w.comm_s += comm_s
        w.delay_sum += delay
        w.delay_max = max(w.delay_max, delay)
        w.batch_size = batch_size or samples
        w.loss = loss
        if compute_s > 0:
            rate = samples / compute_s
            w.samples_per_s = (rate if w.steps == 1
                               else (1 - EMA_WEIGHT) * w.samples_per_s + EMA_WEIGHT * rate)
        self.history.append([now, self.global_step, epoch, worker, loss, delay, w.batch_size])

    def record_eval(self, metrics: dict, *, epoch: int, version: int, now: float) -> None:
        """Append one validation result (metrics as `val_*` names)."""
        moved = wire_bytes(w.to_row() for w in self.workers)
        self.evals.append(eval_row(metrics, epoch=epoch, version=version, step=self.global_step,
                                   now=now, wire_bytes=moved))

    def record_event(self, kind: str, now: float, **fields: object) -> None:
        """A control action or lifecycle event (pause, set_lr, worker lost, ...)."""
        self.events.append({"time": now, "step": self.global_step, "event": kind, **fields})

    def snapshot(self, since: int = 0) -> dict:
        """JSON-able state: node rows, and history rows from index `since` on."""
        return {
            "global_step": self.global_step,
            "nodes": [w.to_row() for w in self.workers],
            "history_start": since,
            "history": self.history[since:],
            "evals": self.evals,
            "events": self.events,
        }


def eval_row(metrics: dict, *, epoch: int, version: int, step: int, now: float,
             wire_bytes: int | None = None) -> dict:
    """One validation result as the views show it (`run.history`'s `val_*` rows), with the
    bytes the workers' sockets had moved by then (`wire_bytes`) where nbdist's links carry
    the training (not a sync run's allreduce).

    Example:
        >>> eval_row({"loss": 0.5}, epoch=1, version=-1, step=20, now=3.0)
        {'time': 3.0, 'step': 20, 'epoch': 1, 'version': -1, 'val_loss': 0.5}
    """
    row = {"time": now, "step": step, "epoch": epoch, "version": version}
    if wire_bytes is not None:
        row["bytes"] = int(wire_bytes)
    return {**row, **{f"val_{k}": float(v) for k, v in metrics.items()}}


def wire_bytes(nodes) -> int | None:
    """The bytes the workers' sockets to the hub moved so far (sent and received, each byte
    counted once: at the worker), from node rows; None where no worker counted any (a sync
    run's ranks report none: their allreduce bypasses nbdist's sockets).

    Example:
        >>> wire_bytes([{"link": "tcp", "bytes_sent": 5, "bytes_received": 7},
        ...             {"link": "shm", "bytes_sent": 1, "bytes_received": 1}])
        14
    """
    total = sum(int(r.get("bytes_sent") or 0) + int(r.get("bytes_received") or 0) for r in nodes)
    return total or None
