"""Every message on a pipeline run's sockets, typed like the hub's (`nbdist.wire.messages`): one
dataclass each, whose annotations `nbdist.wire.schema` turns into the checks on receipt, so a
signed but malformed header is dropped as "malformed header" before anything reads it.

    stage -> neighbour   Forward, Backward, Validation (arrays: in frames, or a shared-memory
                         `Slot`), End (stop before that step), Ack (a slot is free again)
    stage -> kernel      Ops (a step's op times and the stage's counters), StepDone (the last
                         stage: loss), EvalDone (validation metrics), Totals (at the end),
                         Weights (a cell's fit call: the stage's variables at an epoch's end)
    kernel -> stages     Stop (finish the step), Abort (leave at once), Alive (the lease),
                         Release (a fit call's epoch gate), NewRate (run.set_lr)

Example:
    >>> Forward(3, mb=1, src="stage-0", shapes=[[2]], dtypes=["<f4"]).encode()
    {'op': 'F', 'step': 3, 'mb': 1, 'src': 'stage-0', 'shapes': [[2]], 'dtypes': ['<f4']}
    >>> decode(STAGE_MESSAGES, {"op": "end", "step": 4, "src": "stage-2"}).key
    ('end', 4, 0)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nbdist.errors import ProtocolError
from nbdist.wire.schema import Wire, message

# -- between stages ---------------------------------------------------------------------------


@message()
class Slot(Wire):
    """Where a message's arrays lie in its sender's shared-memory segment (`link.StageLink`)."""

    seg: str
    gen: int  # the segment's generation: a newer one replaces it
    slot: int
    offsets: list[int]  # each array's byte offset in the segment


@dataclass
class _FromStage(Wire):
    step: int
    mb: int = 0  # the micro-batch (validation: the batch)
    src: str = ""  # the sending stage

    @property
    def key(self) -> tuple[str, int, int]:
        """Where it waits in the receiver's buffer until the schedule needs it."""
        return self.OP, self.step, self.mb


@dataclass
class _Arrays(_FromStage):
    """A message with arrays: in its frames, or (`shm`) in a slot of the sender's segment."""

    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shm: Slot | None = None


@message("F")
class Forward(_Arrays):
    """Activations at the cut, for one micro-batch."""


@message("B")
class Backward(_Arrays):
    """Their gradients, back to the stage before."""


@message("E")
class Validation(_Arrays):
    """Activations of a validation batch."""


@message("end")
class End(_FromStage):
    """The run stops before `step` (stage 0 decides; each stage tells the next)."""


@message("ack")
class Ack(Wire):
    """The receiver copied a message out of `slot` of segment `seg`: the slot is free again."""

    src: str
    seg: str
    gen: int
    slot: int


STAGE_MESSAGES: dict[str, type[Wire]] = {m.OP: m for m in (Forward, Backward, Validation, End, Ack)}

# -- stage -> kernel --------------------------------------------------------------------------


@message("totals")
class Totals(Wire):
    """A stage's counters: bytes sent, messages with arrays sent by transport, refused by reason."""

    stage: int
    sent: int = 0
    messages: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)


@message("ops")
class Ops(Totals):
    """One step's ops at a stage, [kind, micro-batch, start, end] each (kind F, B or U: the
    update), with the counters so far."""

    step: int = 0
    epoch: int = 0
    ops: list[tuple[str, int, float, float]] = field(default_factory=list)


@message("step")
class StepDone(Wire):
    """The last stage's loss for a step."""

    step: int
    epoch: int
    loss: float
    samples: int
    time: float


@message("eval")
class EvalDone(Wire):
    """The last stage's validation metrics (and the training metrics) at an epoch's end."""

    step: int
    epoch: int
    time: float
    metrics: dict[str, float] = field(default_factory=dict)
    train: dict[str, float] = field(default_factory=dict)
    # the model's metric variables over the epoch's steps, flat (`model.metrics_variables`'s
    # order, as `nbdist.engine.step_metrics.epoch_logs` reads them): a fit call's epoch logs
    state: list[float] = field(default_factory=list)


@message("weights")
class Weights(Wire):
    """A stage's variables at the end of `epoch` (a cell's fit call: the kernel hands the whole
    model to its callbacks), in frames: `counts[i]` arrays for the layer first called at step
    `steps[i]` (`graph.Graph.weights`); then, when a callback saves the whole model, its
    optimizer's slots, one frame each: slot j is named `slot_names[j]` and belongs to the
    variable at `slot_of[j]` among the frames before (`optimizer_slots.stage_slots`), after
    `iterations` steps."""

    stage: int
    epoch: int
    steps: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    slot_of: list[int] = field(default_factory=list)
    slot_names: list[str] = field(default_factory=list)
    iterations: int = 0


REPORTS: dict[str, type[Wire]] = {m.OP: m for m in (Totals, Ops, StepDone, EvalDone, Weights)}

# -- kernel -> stages -------------------------------------------------------------------------


@message("stop")
class Stop(Wire):
    """Finish the step, then end."""


@message("abort")
class Abort(Wire):
    """Leave at once (a failure elsewhere, or Ctrl-C)."""

    reason: str = "aborted"


@message("alive")
class Alive(Wire):
    """The kernel is alive (each of its polls, every half second at most): it renews the
    stages' lease on the run (`nbdist.core.liveness.Lease`); a stage whose kernel is silent
    past the lease's term leaves. It repeats what a stage started again after a lost one may
    have missed: the latest epoch the kernel released (a fit call's gate; -1: none), a stop,
    and the learning rate set while the run trains (None: the cell's own)."""

    released: int = -1
    stop: bool = False
    lr: float | None = None


@message("release")
class Release(Wire):
    """A cell's fit call: the kernel has run its callbacks at the end of `epoch`; the stages
    may train the next one (the epoch gate, as the hub's for the workers)."""

    epoch: int


@message("rate")
class NewRate(Wire):
    """`run.set_lr` (or a callback's new rate): each stage's optimizer takes it from the next
    step the stage begins."""

    lr: float


CONTROLS: dict[str, type[Wire]] = {m.OP: m for m in (Stop, Abort, Alive, Release, NewRate)}


def decode(kinds: Mapping[str, type[Wire]], header: Mapping) -> Wire:
    """The message of one of `kinds` in a verified header, or ProtocolError("malformed
    header") for an op not among them or a field of the wrong type."""
    kind = kinds.get(header["op"])
    if kind is None:
        raise ProtocolError("malformed header",
                            f"op {header['op']!r}, expected one of {', '.join(kinds)}")
    return kind.decode(header)
