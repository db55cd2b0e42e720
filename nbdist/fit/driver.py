"""The epochs of a distributed run as Keras's `fit` shows them to its callbacks (kernel side).

While the run trains, `FitDriver.tick()` (called from the waiting cell, on the main thread)
turns each epoch the hub reports finished into what `fit` would have done at that point:

1. the kernel's model gets the weights the run holds now (its "current weights");
2. the epoch's logs: the training loss and every compiled metric from the state the workers
   summed for that epoch (`nbdist.engine.step_metrics`), then, where `validation_freq` says so,
   `model.evaluate` on the validation data, here, on those weights, as `val_*`;
3. `callbacks.on_epoch_end(epoch, logs)`, then `on_epoch_begin` of the next epoch;
4. what the callbacks decided goes to the run: a new learning rate (`ReduceLROnPlateau`,
   `LearningRateScheduler`) as `run.set_lr` does, `model.stop_training` as `run.stop()`, after
   which the model keeps the weights the callbacks saw (or restored), as in Keras.

The workers wait for this at the epoch's end (the epoch gate: the coordinator hands out no
chunk of the next epoch until `release_epoch`), so, as in `fit`, the weights are exactly the
epoch's, and a rate change or a stop takes effect before the next epoch trains. Batch-level
hooks (`on_train_batch_begin/end`) are called from `tick`, at most every `BATCH_HOOK_S`
seconds and at each epoch's end, not at every step: `batch` is the number of steps of the
epoch so far across all workers, `logs["loss"]` the mean loss of the steps since the previous
call (docs/guide.md, "Your cell").
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from nbdist.engine.flat_layout import write_flat
from nbdist.engine.learning_rate import schedule_name
from nbdist.engine.step_metrics import epoch_logs
from nbdist.errors import NonFiniteLossError, TrainingError
from nbdist.fit.optimizer_state import shard_slots, write_into

log = logging.getLogger(__name__)

BATCH_HOOK_S = 0.5  # batch-level callbacks are called at most this often (see the docstring)


class _RunEnded(Exception):  # noqa: N818 - a signal inside the driver, never raised out of it
    """The run failed while the kernel asked it for its weights."""


class FitDriver:
    """Runs a fit call's callbacks on a running `Run` (see the module docstring)."""

    def __init__(self, run, job, *, show_progress: bool, first_epoch: int = 0):
        import keras  # Keras: after the cell picks its backend

        self.run, self.job, self.fit = run, job, job.fit
        self.model = job.model  # the kernel's model: the callbacks' `self.model`
        call = self.fit.call
        callbacks = list(call.callbacks or [])
        if show_progress and call.verbose != 0:
            callbacks.append(epoch_line(self.fit.epochs))
        self.steps = max(1, math.ceil(job.epoch_size / self.fit.batch))  # as the call counts steps
        self.callbacks = keras.callbacks.CallbackList(
            callbacks, add_history=True, add_progbar=False, model=self.model,
            verbose=call.verbose, epochs=self.fit.epochs, steps=self.steps)
        # a callback that saves the whole model saves its optimizer: it gets the run's state
        self.saves_optimizer = call.saves_whole_model
        self.batch_hooks = any(_overrides(cb, "on_train_batch_end")
                               or _overrides(cb, "on_train_batch_begin")
                               or _overrides(cb, "on_batch_end") for cb in callbacks)
        self.validation = job.contents.validation_arrays
        self.epoch = first_epoch  # the hub epoch to end next (0-based; later when resuming)
        self.last_epoch = job.config.epochs - 1  # the hub's epochs are 0 .. epochs - 1
        self.stopped_by_callbacks = False
        self.logs: dict = {}
        self._batch_at = time.monotonic()
        self._rows_seen = 0
        self._epoch_steps = 0

    @property
    def keras_epoch(self) -> int:
        """The epoch as the cell's fit call counts it (from its `initial_epoch`)."""
        return self.fit.initial_epoch + self.epoch

    # -- the calls ----------------------------------------------------------------------------

    def begin(self) -> None:
        self.model.stop_training = False
        self.callbacks.on_train_begin()
        self._epoch_begin()

    def tick(self) -> None:
        """Handle what the run finished since the last call (main thread, while it trains)."""
        if self.stopped_by_callbacks or self.run.state.final_weights is not None:
            return  # training has ended: `end` reports what is left, on the final weights
        if self.batch_hooks:
            self._batch_hooks()
        try:  # (the last epoch's end is the run's: `end` reports it on the final weights)
            while (self.epoch < self.last_epoch and self.epoch in self._epochs_ended()
                   and not self.stopped_by_callbacks):
                self._epoch_end(weights=self._current_weights())
        except _RunEnded:
            return  # the wait raises the run's error

    def end(self):
        """After the run ended: the epochs left (a run stopped mid-epoch ends it with what it
        trained, as Keras's fit does after `stop_training`), then `on_train_end`. Returns
        the History."""
        run = self.run
        if not self.stopped_by_callbacks:
            final = run.state.final_weights
            while self.epoch <= self.last_epoch and not self.stopped_by_callbacks:
                partial = self.epoch not in self._epochs_ended()
                if partial and str(self.epoch) not in run.stats.get("epoch_metrics", {}):
                    break  # stopped before this epoch trained anything
                self._epoch_end(weights=final)
                final = None  # written once; the epochs after it keep them
                if partial:
                    break
            if final is not None:  # no epoch left to report: the model still gets the result
                self._write(final)
        self.callbacks.on_train_end(logs=self.logs)
        return self.model.history

    def terminated_on_nan(self, error: BaseException) -> bool:
        """A worker stopped the run at a NaN or infinite loss: with `TerminateOnNaN` among the
        callbacks, that is how the fit ends (it prints and stops, as in Keras; the model keeps
        the last epoch's weights). Without it the error is raised from the fit call."""
        import keras  # Keras: after the cell picks its backend

        if not isinstance(error, NonFiniteLossError) or not any(
                isinstance(cb, keras.callbacks.TerminateOnNaN) for cb in self.callbacks.callbacks):
            return False
        self.callbacks.on_train_batch_end(self._epoch_steps, {"loss": math.nan})
        self.stopped_by_callbacks = True
        return True

    # -- pieces ---------------------------------------------------------------------------------

    def _epochs_ended(self) -> set[int]:
        """The hub epochs that have ended (every sample of them trained on)."""
        return {int(e["epoch"]) for e in self.run.stats.get("events", [])
                if e.get("event") == "epoch_end"}

    def _epoch_begin(self) -> None:
        if self.epoch > self.last_epoch:
            return
        self._epoch_steps = 0
        with self._rate_watch():
            self.callbacks.on_epoch_begin(self.keras_epoch)

    def _epoch_end(self, weights) -> None:
        if self.batch_hooks:  # the steps not yet reported, before the epoch's end
            self._batch_hooks(force=True)
        epoch = self.keras_epoch
        if weights is not None:
            self._write(weights)
        if self.saves_optimizer:
            self._write_optimizer()
        logs = self._train_logs(self.epoch)
        if self.validation is not None and self.fit.call.should_validate(epoch):
            logs.update({f"val_{k}": v for k, v in self._evaluate().items()})
            self._record_eval(epoch, logs)
        self.logs = logs
        with self._rate_watch():
            self.callbacks.on_epoch_end(epoch, logs)
        ended, self.epoch = self.epoch, self.epoch + 1
        if getattr(self.model, "stop_training", False):
            self._stop()
            return
        self._epoch_begin()
        if self.epoch <= self.last_epoch:
            try:
                self.run.release_epoch(ended)  # the workers wait for it (the epoch gate)
            except TrainingError:  # the run ended meanwhile (stopped, failed): nothing waits
                pass

    def _train_logs(self, hub_epoch: int) -> dict:
        sums = self.run.stats.get("epoch_metrics", {}).get(str(hub_epoch))
        if sums is None:
            return {}
        return epoch_logs(self.model, np.asarray(sums, dtype=np.float64))

    def _evaluate(self) -> dict:
        call = self.fit.call
        x, y, sw = (*self.validation, None)[:3]
        result = self.model.evaluate(x, y, sample_weight=sw,
                                     batch_size=call.validation_batch_size or self.fit.batch,
                                     steps=call.validation_steps, verbose=0, return_dict=True)
        return {k: float(v) for k, v in result.items()}

    def _record_eval(self, epoch: int, logs: dict) -> None:
        """Show the kernel's validation in the run's views (dashboard, `run.history`)."""
        metrics = {k[4:]: v for k, v in logs.items() if k.startswith("val_")}
        try:
            self.run.record_eval(self.epoch, metrics)
        except Exception as exc:  # noqa: BLE001 - the run may just have ended: the views miss one row
            log.warning("could not record the kernel's validation in the run's views: %s", exc)

    def _current_weights(self):
        """The run's weights now (at the epoch gate: the epoch's). A run that fails meanwhile
        has no hub to ask any more: its own error is what the waiting cell raises."""
        try:
            return self.run.current_weights()
        except TrainingError:
            if self.run.state.error is not None:
                raise _RunEnded from None
            raise

    def _write(self, weights) -> None:
        write_flat(self.model, *weights)
        if self.run.state.settle_model is not None:  # precise BatchNorm statistics
            self.run.state.settle_model(self.model)

    def _write_optimizer(self) -> None:
        """The run's optimizer state now (its slots, its step count) into the kernel model's
        optimizer, for a callback that saves the whole model (`nbdist.fit.optimizer_state`).
        While the run trains it is fetched from the hubs (the workers wait at the epoch gate);
        after its last epoch, it is the state the run's monitor kept at that epoch's end."""
        state = self.run.state
        try:
            if state.final_weights is None:
                opt = state.backend.optimizer_state(state.control, False)
            elif state.kept is not None and state.kept[2] and state.kept_epoch == self.epoch:
                opt = shard_slots(state.kept[2])
            else:
                opt = state.backend.optimizer_state(state.control, True)
        except Exception as exc:  # noqa: BLE001 - the weights are saved still
            log.warning("run %s: the optimizer's state of epoch %d could not be fetched; a model "
                        "saved now holds the weights only: %s", state.run_id, self.epoch + 1, exc)
            return
        if opt is None:
            return  # the workers keep the optimizer (no hub state); nothing to add
        missing = write_into(self.model, opt)
        if missing:
            log.warning("run %s: the cell's optimizer has no variables for the hub's slots %s; "
                        "a model saved now holds their initial values", state.run_id, missing)

    def _stop(self) -> None:
        """A callback set `model.stop_training`: end the run; the model keeps the weights the
        callbacks saw (the run's final weights are not written: `end`)."""
        self.stopped_by_callbacks = True
        self.run.stop()

    def _batch_hooks(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._batch_at < BATCH_HOOK_S and not force:
            return
        rows = self.run.history_rows(self._rows_seen)
        if not rows:
            return
        self._batch_at, self._rows_seen = now, self._rows_seen + len(rows)
        losses = [r[4] for r in rows]
        self._epoch_steps += len(rows)
        batch = self._epoch_steps - 1
        self.callbacks.on_train_batch_begin(batch)
        self.callbacks.on_train_batch_end(batch, {"loss": float(np.mean(losses))})
        if getattr(self.model, "stop_training", False):
            self._stop()

    def _rate_watch(self):
        return _RateWatch(self)


class _RateWatch:
    """Around callbacks: the kernel optimizer shows the run's rate; a change they make is
    passed to the run (`run.set_lr`), recorded in `run.events` with who made it."""

    def __init__(self, driver: FitDriver):
        self.driver = driver

    def __enter__(self):
        optimizer = self.driver.model.optimizer
        self.constant = schedule_name(optimizer) is None
        self.before = None
        if self.constant:
            rate = self.driver.run.lr
            if rate is not None:
                optimizer.learning_rate.assign(rate)
            self.before = _rate(optimizer)
        return self

    def __exit__(self, *exc) -> None:
        driver = self.driver
        if exc[0] is not None or not self.constant or driver.run.state.final_weights is not None:
            return  # (nothing trains any more once the run has ended)
        after = _rate(driver.model.optimizer)
        if not math.isclose(after, self.before, rel_tol=1e-6):
            names = ", ".join(type(cb).__name__ for cb in driver.fit.call.callbacks or []
                              if _overrides(cb, "on_epoch_end") or _overrides(cb, "on_epoch_begin"))
            driver.run.set_lr(after, by=f"callback ({names})")


def _rate(optimizer) -> float:
    return float(optimizer.learning_rate.numpy())


def _overrides(callback, method: str) -> bool:
    import keras  # Keras: after the cell picks its backend

    own = getattr(type(callback), method, None)
    return own is not None and own is not getattr(keras.callbacks.Callback, method)


def epoch_line(epochs: int):
    """A callback printing one line per epoch, as Keras's `verbose=2` does (where there is no
    dashboard): `Epoch 2/15 - 4s - loss: 0.4211 - accuracy: 0.8512 - val_loss: ...`."""
    import keras  # Keras: after the cell picks its backend

    class EpochLine(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.monotonic()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.monotonic() - getattr(self, "started", time.monotonic())
            values = " - ".join(f"{k}: {v:.4f}" for k, v in (logs or {}).items())
            print(f"Epoch {epoch + 1}/{epochs} - {seconds:.0f}s - {values}", flush=True)

    return EpochLine()
