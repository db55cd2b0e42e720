"""Everything one run knows, in one object: `RunState`.

The Run's parts share it: the handle (`handle.py`) owns it and shows parts of it as public
attributes, the views (`views.py`) read what the monitor fetched, the controls (`control.py`)
use the backend and the control line, and the monitor thread (`monitor.py`) fills it in.
A mode's start hands its running job over with `Run.begin`; nothing else sets it from outside.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nbdist.core.traffic import TrafficRates
from nbdist.run.backend import Backend


@dataclass(eq=False)
class RunState:
    """One run's state. `control` is what the monitor polls and the controls send to: the hub's
    `HubControl`, a `Simulation`, or a pipeline's `PipelineControl`."""

    config: object  # nbdist.config.TrainConfig
    model: object  # the kernel's model; holds the trained weights at the end
    model_name: str
    # how the run trains unlike the cell, or what went wrong without failing it
    warnings: list[str] = field(default_factory=list)
    notes: list[dict] = field(default_factory=list)  # choices made before the start (Run.note)

    # -- lifecycle: starting -> running <-> paused -> finished | stopped | failed --------------
    status: str = "starting"
    error: BaseException | None = None
    run_id: str = ""
    backend: Backend | None = None  # set once, by Run.begin
    control: object | None = None  # set once, by Run.begin
    hubs: list[dict] = field(default_factory=list)  # one per hub shard: shard, host, engine, spin_s
    stop_requested: bool = False
    # training has ended (the weights are in the model, the engines free); the Run's Future is
    # completed just after (monitor.conclude), with a fit call once it has returned
    ended: threading.Event = field(default_factory=threading.Event)
    listeners: list[Callable] = field(default_factory=list)  # called after each poll (displays)

    # -- what the monitor fetched from the hub ----------------------------------------------------
    rows: list[list] = field(default_factory=list)  # history rows (HISTORY_COLUMNS)
    snapshot: dict = field(default_factory=dict)  # the hub's latest statistics
    timeline: list[dict] = field(default_factory=list)
    timeline_at: float = 0.0  # monotonic time of the last timeline fetch
    traffic: TrafficRates = field(default_factory=TrafficRates)  # each worker's bytes/s
    revision: int = 0  # +1 per stats poll: displays redraw only what changed
    timeline_revision: int = 0  # +1 per timeline fetch
    events_seen: int = 0  # hub events already turned into warnings
    # a lost shard 0 taken over (nbdist.run.takeover): its new process counts history rows,
    # events, validations and epoch metrics from 0, so the kernel keeps what the earlier ones
    # sent (`earlier_hub`, merged into each snapshot by the monitor's `absorb`)
    rows_base: int = 0  # rows before the coordinating shard's current process
    earlier_hub: dict = field(default_factory=dict)
    # one event per fault the run survived: `shard_taken_over` (nbdist.run.takeover),
    # `ranks_restarted` (nbdist.run.restart)
    recoveries: list[dict] = field(default_factory=list)
    # the latest snapshot of every hub shard's state (nbdist.run.takeover.Snapshot), or None
    hub_snapshot: object | None = None
    hub_snapshot_next: float = 0.0  # monotonic time the next is due (the first poll takes one)

    # -- a cell's own fit call (nbdist.fit) ------------------------------------------------------
    # False: the kernel writes each epoch's weights itself, not the monitor
    write_model: bool = True
    # what the kernel does to the notebook's model once it wrote the run's weights into it
    # (`Job.settle_model`: precise BatchNorm statistics), or None
    settle_model: Callable | None = None
    final_weights: tuple | None = None  # (params, non_trainable) once training ended
    # the latest state the kernel holds (monitor.keep: after each epoch's end, and when the run
    # fails while its hub still answers), so a failed run keeps what it learned:
    # (params, non_trainable, shards' checkpoint state or None, what they are: "the end of ...")
    kept: tuple | None = None
    kept_epoch: int | None = None  # the last epoch whose end it was kept after
    keras_history: object = None  # the keras.callbacks.History the cell's fit call returned
    # a run with a fit call: set once that call has returned (Run.fit_call_returned), and
    # only then is the run's Future completed with its History; None without a fit call
    fit_call_returned: threading.Event | None = None
    released_at: float = 0.0  # monotonic time the kernel last let the workers start an epoch

    # -- checkpoints -----------------------------------------------------------------------------
    # what every checkpoint of the run records (nbdist.job.Job.checkpoint_info)
    checkpoint_info: dict = field(default_factory=dict)
    last_checkpoint: str | None = None  # path of the latest checkpoint written
    checkpoint_lock: threading.Lock = field(default_factory=threading.Lock)
    checkpoint_folder: object | None = None  # its claim on --checkpoint-dir (checkpoint.folder)
    checkpoint_at: float = field(default_factory=time.monotonic)
