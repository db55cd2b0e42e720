"""A Run's result as a Future: the `keras.callbacks.History` of the run.

With a cell's own `model.fit(...)` call, the History is the one that call returned (its
callbacks saw each epoch's logs: the loss, every compiled metric, `val_*`). Without one (a cell
that only builds and compiles its model, `nbdist.train` from code, or a fit call that raised
before it returned), `epoch_history` builds one from what the run recorded, as `fit` would
have logged it: per epoch, `loss` is the mean of the losses the workers pushed in that epoch
(a history row's `epoch` is the progress after its push, 0.5 = half of the first epoch done),
weighted by their batch sizes (Keras's `fit` weights its batches' losses by their sizes too),
and the `val_*` results of the epoch's validation, where one ran. A run stopped mid-epoch has
that epoch too, with what it trained, as Keras's `fit` logs an epoch ended by
`stop_training`. `history.epoch` holds the run's epochs (0-based; a resumed run's go on from
its checkpoint's). With `--metrics minimal` the hub keeps no rows: only `val_*` are there.
"""

from __future__ import annotations

import math

from nbdist.run.state import RunState

EPOCH, LOSS, BATCH_SIZE = 2, 4, 6  # columns of a history row (nbdist.core.stats.HISTORY_COLUMNS)


def run_history(state: RunState):
    """The run's History: its fit call's, or one built from its epochs (`epoch_history`)."""
    if state.keras_history is not None:
        return state.keras_history
    return epoch_history(state)


def epoch_history(state: RunState):
    """A `keras.callbacks.History` of the run's epochs (see the module docstring)."""
    import keras  # deferred: `import nbdist` loads no deep-learning framework

    logs = epoch_logs(state.rows, state.snapshot.get("evals", []))
    history = keras.callbacks.History()
    history.epoch = sorted(logs)
    for epoch in history.epoch:
        for name, value in logs[epoch].items():
            history.history.setdefault(name, []).append(value)
    history.set_params({"epochs": getattr(state.config, "epochs", None), "verbose": 0,
                        "steps": None})
    if state.model is not None:
        history.set_model(state.model)
    return history


def epoch_logs(rows: list[list], evals: list[dict]) -> dict[int, dict[str, float]]:
    """Per epoch, the logs `fit` would have given `on_epoch_end`: `loss` from the pushed
    rows (batch-size-weighted), then the epoch's latest `val_*` results."""
    sums: dict[int, list[float]] = {}
    for row in rows:
        loss, size = row[LOSS], row[BATCH_SIZE] or 1
        if loss is None or row[EPOCH] is None or not math.isfinite(loss):
            continue
        epoch = max(0, math.ceil(row[EPOCH]) - 1)  # progress 1.0 is the first epoch's last push
        total = sums.setdefault(epoch, [0.0, 0.0])
        total[0] += float(loss) * size
        total[1] += size
    logs = {epoch: {"loss": total / weight} for epoch, (total, weight) in sums.items()}
    for result in evals:
        epoch = result.get("epoch")
        if isinstance(epoch, int):
            logs.setdefault(epoch, {}).update(
                {k: float(v) for k, v in result.items() if k.startswith("val_")})
    return logs
