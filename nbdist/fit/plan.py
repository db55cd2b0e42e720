"""The run's options from a cell's `model.fit(...)` call and the magic's flags (pure).

A flag on the magic line wins over the call, and the run's notes say which value won. What
has no flag (callbacks, shuffle, class weights, validation frequency, ...) is kept in the
`FitSpec` the job carries. Batch sizes: the call's `batch_size` is the model's batch. In the
asynchronous modes each push is one such batch, as each `fit` step is; in `--mode sync` the
ranks share it (each takes `batch_size // ranks`), so a step's global batch is the call's.
`--batch-size` stays what it always was: samples per worker step.
"""

from __future__ import annotations

from dataclasses import dataclass

from nbdist.engine.fit_call import FitCall
from nbdist.engine.fit_data import FitData
from nbdist.errors import ConfigError

# the call's arguments a flag may override: flag option name -> how the call spells it
OVERRIDES = {"epochs": "epochs", "batch_size": "batch_size", "data": "x, y",
             "validation": "validation_data", "no_validation": "validation_data"}


@dataclass(frozen=True)
class FitSpec:
    """What a run keeps of the cell's fit call once the options are decided."""

    call: FitCall  # callbacks, verbose, validation_freq/steps/batch_size, ...
    placed: FitData  # where its data was put (nbdist.engine.fit_data)
    epochs: int  # Keras's `epochs`: the index of the last epoch plus one
    initial_epoch: int
    batch: int  # the model's batch: samples per step as the call counts them
    split_batch: bool  # --mode sync (or simulated): the ranks share `batch` (no --batch-size)
    epoch_size: int | None  # samples per epoch when fewer than a pass (steps_per_epoch)
    ordinal: int = 0  # which of the cell's fit calls (0: the first): one run for each
    batch_from_call: bool = True  # `batch` is the call's (no --batch-size flag)

    @property
    def passes(self) -> int:
        """Epochs to train: from `initial_epoch` up to `epochs`."""
        return self.epochs - self.initial_epoch

    @property
    def shuffle(self) -> bool:
        return bool(self.call.shuffle)


def plan_fit(call: FitCall, placed: FitData, given: dict, mode: str,
             sim_sync: bool = False) -> tuple[FitSpec, dict, list[str]]:
    """(what the run keeps of the call, the options for `TrainConfig`, notes for the run):
    `given` holds the options the magic line or `nbdist.train` set explicitly; `sim_sync`:
    `--mode simulate --sim sync=1`, whose virtual ranks share the batch as sync's do.

    Example:
        >>> from nbdist.engine.fit_data import FitData
        >>> call = FitCall.bind("m", ("x", "y"), {"epochs": 15, "batch_size": 128})
        >>> spec, options, notes = plan_fit(call, FitData(("x", "y"), ()), {"epochs": 2}, "async")
        >>> options, spec.passes
        ({'epochs': 2, 'batch_size': 128}, 2)
        >>> notes
        ['--epochs 2 on the magic line overrides model.fit(epochs=15).']
    """
    call.check()
    notes = [f"{_flag(name)} {_shown(given[name])} on the magic line overrides "
             f"model.fit({OVERRIDES[name]}={_call_value(call, name)})."
             for name in OVERRIDES if name in given and _call_gave(call, name)
             and _shown(given[name]) != _call_value(call, name)]
    epochs = int(given.get("epochs", call.epochs))
    if epochs <= call.initial_epoch:
        raise ConfigError(f"--epochs {epochs} trains no epoch after model.fit(initial_epoch="
                          f"{call.initial_epoch}): as in Keras, epochs is the index of the last "
                          f"epoch plus one. Pass --epochs {call.initial_epoch + 1} or more.")
    batch = int(given.get("batch_size", call.batch))
    epoch_size = None
    if call.steps_per_epoch is not None and placed.take_batches is None:
        epoch_size = call.steps_per_epoch * batch  # an epoch is part of a pass (or all of it)
    spec = FitSpec(call=call, placed=placed, epochs=epochs, initial_epoch=call.initial_epoch,
                   batch=batch, split_batch=(mode == "sync" or (mode == "simulate" and sim_sync))
                   and "batch_size" not in given,
                   epoch_size=epoch_size, batch_from_call="batch_size" not in given)
    return spec, {"epochs": spec.passes, "batch_size": batch}, notes


def sync_batches(batch: int, ranks: int) -> tuple[int, str | None]:
    """Each rank's batch when `ranks` share the call's `batch` (sync ranks, or async workers
    whose pushes the hub averages), and a warning when they cannot share it exactly.

    Example:
        >>> sync_batches(128, 2), sync_batches(128, 3)[0]
        ((64, None), 42)
    """
    each = max(1, batch // ranks)
    if each * ranks == batch:
        return each, None
    return each, (f"model.fit(batch_size={batch}) is shared by {ranks} ranks as {each} samples "
                  f"each, so each step trains on {each * ranks} samples, not {batch}. Use a batch "
                  f"size that {ranks} divides, or --batch-size to set each rank's batch.")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def _call_gave(call: FitCall, name: str) -> bool:
    if name == "data":
        return "x" in call.given
    if name in ("validation", "no_validation"):
        return call.validation_data is not None or bool(call.validation_split)
    return name in call.given


def _call_value(call: FitCall, name: str) -> str:
    if name == "data":
        return "..."
    if name in ("validation", "no_validation"):
        return ("..." if call.validation_data is not None
                else f"None, validation_split={call.validation_split}")
    return _shown(getattr(call, name))
