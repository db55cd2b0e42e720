"""Checkpoints of a `--mode sync` run, in the async checkpoint format (`nbdist.checkpoint.store`).

In sync mode the weights live in the Horovod ranks, all identical, and the hub holds none. So rank 0
is the source: when the kernel wants a checkpoint it asks the hub (control `send_state`), the hub
passes the request to rank 0 on its next `report` reply, and rank 0, between two allreduce steps,
sends its weights, its Keras optimizer's slots (momentum, Adam's moments; `iterations` as a number)
and its data position to the hub, which keeps the latest copy and answers the kernel's `state`
request with it (`nbdist.hub.export.hub_state`). Rank 0 also sends one when training ends, which the
final checkpoint uses. The kernel writes the files with `checkpoint.save`, so the atomic format, the
checksum and the checks on load are the async ones; `meta.json` gains a `sync` entry (optimizer
class, slot shapes, iterations), and `config.mode` is "sync", so `nbdist.resume` refuses to continue
it as an async run, and the reverse.

The data position: sync ranks walk each epoch's permutation in global batches, so it is (epoch,
samples of that epoch done), written as an `EpochSchedule` state with nothing in flight
(`nbdist.core.schedule.schedule_state`). A resume starts there, whatever the new number of ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from nbdist.core.schedule import remaining_per_epoch
from nbdist.errors import CheckpointError, TrainingError
from nbdist.wire.messages import Report, ShardState, SyncState

NOT_SLOTS = ("iteration", "learning_rate")  # Keras optimizer variables saved as numbers instead
STATE_WAIT_S = 30.0


# -- on the ranks -----------------------------------------------------------------------------


def optimizer_slots(optimizer) -> list:
    """The Keras optimizer's per-parameter variables (momentum, moments), in build order."""
    return [v for v in optimizer.variables if v.path.rsplit("/", 1)[-1] not in NOT_SLOTS]


def read_slots(optimizer) -> np.ndarray:
    slots = optimizer_slots(optimizer)
    if not slots:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([np.asarray(v.numpy(), dtype=np.float32).ravel() for v in slots])


def write_slots(optimizer, flat: np.ndarray) -> None:
    offset = 0
    for v in optimizer_slots(optimizer):
        n = int(np.prod(v.shape))
        v.assign(flat[offset: offset + n].reshape(v.shape))
        offset += n


def check_slots(optimizer, shapes: list, engine: int) -> None:
    """Refuse optimizer state saved for another optimizer (SGD momentum into Adam, ...)."""
    have = [list(v.shape) for v in optimizer_slots(optimizer)]
    if have != [list(s) for s in shapes]:
        raise CheckpointError(
            f"[engine {engine}] The checkpoint's optimizer state has slots of shapes {shapes}; "
            f"this cell's {type(optimizer).__name__} keeps {have}. Compile the model with the "
            "optimizer of the checkpointed run (same class, same momentum setting), or start "
            "afresh.")


def snapshot(loop, worker: int, seq: int, epoch: int, offset: int, steps: int,
             final: bool = False) -> tuple[Report, list[np.ndarray]]:
    """Rank 0's `report` carrying its state: weights, optimizer slots, data position (`worker`:
    the hub's id for rank 0, another after a restart on the ranks left)."""
    optimizer = loop.model.optimizer
    params, non_trainable = loop.flat.read()
    state = SyncState(seq=int(seq), epoch=int(epoch), offset=int(offset), steps=int(steps),
                      final=final, lr=float(loop.lr),
                      iterations=int(optimizer.iterations.numpy()),
                      optimizer=type(optimizer).__name__,
                      slots=[[int(n) for n in v.shape] for v in optimizer_slots(optimizer)])
    return Report(worker, state=state), [params, non_trainable, read_slots(optimizer)]


# -- in the kernel ----------------------------------------------------------------------------


class RankEndedError(TrainingError):
    """Rank 0 had returned when its state was asked for: nothing is lost, since the weights it
    returned are the run's final ones (the kernel's periodic copy says so at INFO, not as a
    warning)."""


def fresh_state(control, final: bool, timeout: float = STATE_WAIT_S,
                ended: Callable[[], bool] | None = None) -> list[tuple[ShardState, list]]:
    """Rank 0's state, taken after this call (`final`: the one it sent when training ended).
    `ended()` says whether rank 0's task has returned: then no state will come, and waiting
    the whole timeout for one would only hold up the run's end."""
    (state, buffers), = control.state()
    if final or state.final:  # training ended: no newer state will come
        if state.state_seq is None:
            raise TrainingError("Rank 0 sent no state at the end of training, so there is nothing "
                                "to checkpoint. Its last checkpoint is the one to resume from.")
        return [(state, buffers)]
    seen = state.state_seq or 0  # 0: the hub holds none of rank 0's yet
    control.control(send_state=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.05)
        (state, buffers), = control.state()
        if (state.state_seq or 0) > seen or state.state_seq is not None and state.final:
            return [(state, buffers)]
        if ended is not None and ended():
            raise RankEndedError(
                "Rank 0 had ended its training before it was asked for its state, so it sends "
                "none. The weights it returned are the run's final ones (run.model).")
    raise TrainingError(
        f"Rank 0 did not send its weights for the checkpoint within {timeout:.0f}s (it is stuck "
        "in a step, or its engine died). Check `run.nodes` and the engines; the previous "
        "checkpoint is kept.")


def start_position(ckpt, epochs: int) -> tuple[int, int]:
    """Where a resumed sync run starts: (epoch, samples of that epoch already done)."""
    remaining = remaining_per_epoch({**ckpt.meta["schedule"], "epochs": epochs})
    for epoch, left in enumerate(remaining):
        if left:
            return epoch, int(ckpt.meta["num_samples"]) - int(left)
    return epochs, 0


def resume_fields(ckpt, epochs: int) -> dict:
    """What a resumed run's SyncSpec gets from the checkpoint (nothing for a fresh run)."""
    if ckpt is None:
        return {}
    epoch, offset = start_position(ckpt, epochs)
    sync = ckpt.meta["sync"]
    return {"initial_slots": ckpt.arrays["shard0.optimizer_slots"],
            "resume": {"epoch": epoch, "offset": offset, "steps": int(sync["steps"]),
                       "iterations": int(sync["iterations"]), "slots": sync["slots"]}}


def check_optimizer(ckpt, model) -> None:
    """Refuse, before any engine is used, a cell whose optimizer differs from the saved one."""
    saved, here = ckpt.meta["sync"]["optimizer"], type(model.optimizer).__name__
    if saved != here:
        raise CheckpointError(
            f"The checkpoint {ckpt.path} holds the state of a {saved} optimizer; this cell "
            f"compiles its model with {here}. Compile it with {saved} as in the checkpointed run, "
            "or start afresh with nbdist.train / %%distribute.")


def check_meta(meta_path: str, meta: dict, arrays: dict, corrupt) -> None:
    """A sync checkpoint names its optimizer's slots, and they add up to its array."""
    sync = meta.get("sync")
    is_sync = meta["config"].get("mode") == "sync"
    if is_sync != isinstance(sync, dict):
        raise corrupt(meta_path, "its mode and its 'sync' entry disagree")
    if not is_sync:
        return
    try:
        size = sum(int(np.prod(s)) for s in sync["slots"])
        int(sync["iterations"])
        str(sync["optimizer"])
    except (KeyError, TypeError, ValueError) as exc:
        raise corrupt(meta_path, f"its 'sync' entry is malformed ({exc!r})") from None
    slots = arrays.get("shard0.optimizer_slots")
    if slots is None or slots.size != size:
        raise corrupt(meta_path, f"its optimizer state does not hold the {size} floats its slots "
                                 f"{sync['slots']} need")
