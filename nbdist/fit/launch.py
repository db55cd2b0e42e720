"""The cell reached its `model.fit(...)` call in the kernel: train distributed, return `History`.

`FitLauncher.on_fit` is what `model.fit` does while a `%%distribute` cell runs in the kernel
(`nbdist.api`): it puts the call's data in place, merges the call with the magic's flags
(`nbdist.fit.plan`), prepares the job and starts the mode's run, shows it (the magic's
`Presenter`: the `-o` name, the dashboard), then waits, driving the callbacks on each epoch
(`nbdist.fit.driver`), and returns the History, so the cell's next statements run on the
trained model. Nothing of Keras's own training loop runs.
"""

from __future__ import annotations

import contextlib
import importlib
import io
from collections.abc import Callable
from dataclasses import replace

from nbdist.core.schedule import EpochSchedule
from nbdist.engine.fit_call import MODEL, RESERVED, answered_fit, earlier_fit
from nbdist.engine.fit_data import place
from nbdist.engine.run_cell import EARLIER_FITS, run_until_fit, unpack
from nbdist.errors import CheckpointError, ConfigError, TrainingError
from nbdist.fit.driver import FitDriver
from nbdist.fit.plan import plan_fit
from nbdist.job import prepare_job
from nbdist.modes import mode_spec
from nbdist.run.live_wait import wait_live


def start_function(mode: str) -> Callable:
    """The mode's `start(job, *, cluster, wait) -> Run`, its package imported now, by the name
    its `ModeSpec` gives. Here, in the entry layer, because importing a mode's package is
    reaching up from everything below: the `MODES` table only names it."""
    return importlib.import_module(mode_spec(mode).module).start


class Presenter:
    """How a run is shown and waited for. This one (for `nbdist.train` from code) shows
    nothing and waits in slices; the magic's shows the dashboard and keeps it live."""

    shows_dashboard = False

    def started(self, run) -> None:
        """The run is up (the magic binds `-o NAME` and shows the dashboard here)."""

    def wait(self, run, on_tick) -> None:
        """Block until the run ends, calling `on_tick()` often from this (the main) thread;
        raises the run's error if it failed."""
        wait_live(run, None, on_tick=on_tick)  # without a kernel: a plain wait that ticks


class FitLauncher:
    """`on_fit` for one cell in the kernel (see the module docstring)."""

    def __init__(self, cell: str, config, namespace: dict, cluster, checkpoint, given: dict,
                 presenter: Presenter | None, start):
        self.cell, self.config, self.ns, self.cluster = cell, config, namespace, cluster
        self.checkpoint, self.given = checkpoint, given
        # the mode's start(job, cluster=, wait=) -> Run (nbdist.modes, via the api)
        self.start = start
        self.presenter = presenter or Presenter()
        self.run = None  # the latest run: one per fit call the cell makes
        self.earlier: list[dict] = []  # what each fit call returned so far (`earlier_fit`)

    def on_fit(self, call):
        ordinal = len(self.earlier)  # which of the cell's fit calls this is (0: the first)
        resumes = self._resumed_call()
        if ordinal < resumes:  # --resume continues a later call: this one trained before
            history = answered_fit(call.model, {"epoch": [], "history": {}, "params": {}})
            print(f"nbdist: the cell's fit call {ordinal + 1} does not train again: --resume "
                  f"continues its fit call {resumes + 1} from {self.checkpoint.path}.")
            self.earlier.append(earlier_fit(history))
            return history
        history = self._train(call, ordinal, self.checkpoint if ordinal == resumes else None)
        self.earlier.append(earlier_fit(history))
        return history

    def _train(self, call, ordinal: int, checkpoint):
        """One distributed run for the cell's fit call number `ordinal` (from 0); its History."""
        config = self.config
        self._check_model(call)
        placed = place(call, self.ns)
        try:
            spec, options, notes = plan_fit(call, placed, self.given, config.mode.value,
                                            sim_sync=bool(config.sim.get("sync")))
            spec = replace(spec, ordinal=ordinal)
            config = config.replace(**options)
            job = prepare_job(self.cell, config, self.ns, checkpoint, fit=spec,
                              **self._found(placed))
            pushed = dict(job.contents.pushed)
            if self.earlier:  # the engines answer the earlier calls and stop at this one
                pushed[EARLIER_FITS] = list(self.earlier)
            job = replace(job, contents=replace(job.contents, pushed=pushed,
                                                notes=[*job.contents.notes, *notes]),
                          warnings=[*job.warnings, *([placed.warning] if placed.warning else [])])
            if mode_spec(config.mode).in_kernel:  # the workers must not train the kernel's model
                job = replace(job, trainer_namespace=self._private_copy(job))
            run = self.run = self.start(job, cluster=self.cluster, wait=False)
            return self._drive(run, job)
        finally:
            for name in RESERVED:
                self.ns.pop(name, None)  # the cell's own names stay; nbdist's go

    def check_resumed(self) -> None:
        """After the cell ran: --resume named a fit call the cell never reached (it was edited
        since the checkpoint), so nothing of the checkpoint trained; say so instead."""
        resumes = self._resumed_call()
        if self.checkpoint is not None and self.earlier and len(self.earlier) <= resumes:
            raise CheckpointError(
                f"{self.checkpoint.path} was taken by the cell's fit call {resumes + 1}, but the "
                f"cell makes {len(self.earlier)} fit call(s) (Received: a cell edited since the "
                "checkpoint?), so nothing was resumed. Resume with the cell that took it, or "
                "start afresh without --resume.")

    def _resumed_call(self) -> int:
        """Which fit call of the cell --resume continues (its checkpoint says; 0 without one)."""
        if self.checkpoint is None:
            return 0
        return int(self.checkpoint.meta.get("fit_call", 0))

    def _drive(self, run, job):
        """Show and wait for `run`, driving the callbacks; returns the History, which is also
        the run's result (`Run.fit_call_returned`, given on every way out of here)."""
        history = None
        try:
            history = self._callbacks_on(run, job)
            return history
        finally:
            run.fit_call_returned(history)  # the monitor completes the run's Future now

    def _callbacks_on(self, run, job):
        self.presenter.started(run)
        first = 0
        if job.checkpoint is not None:  # resumed: the epochs go on where the checkpoint stood
            first = EpochSchedule.from_state(job.checkpoint.meta["schedule"]).first_unfinished_epoch
        driver = FitDriver(run, job, show_progress=not self.presenter.shows_dashboard,
                           first_epoch=first)
        driver.begin()
        try:
            self.presenter.wait(run, driver.tick)
        except Exception as exc:  # the run's own error (a worker's NaN loss), or a callback's
            if exc is not run.error or not driver.terminated_on_nan(exc):
                raise
        return driver.end()

    def _check_model(self, call) -> None:
        name = self.given.get("model")
        if name is not None and self.ns.get(name) is not call.model:
            raise ConfigError(
                f"--model {name} names another model than the one the cell's model.fit() trains "
                f"(Received: --model {name}). Drop --model: with a fit call, the model it is "
                "called on is the one nbdist trains.")

    def _found(self, placed) -> dict:
        """What the fit call names, where no flag says otherwise (`inspect_cell`'s overrides)."""
        model = self.ns[MODEL]
        names = [k for k, v in self.ns.items() if v is model and not k.startswith("_")]
        found = {"model_name": names[0] if names else MODEL, "take_batches": placed.take_batches}
        if "data" not in self.given:
            found["data"] = placed.data
        if "validation" not in self.given and "no_validation" not in self.given:
            found["validation"] = placed.validation
        return found

    def _private_copy(self, job) -> dict:
        """The cell run again, up to its fit call, in a namespace of its own (its output
        hidden): the model the in-kernel workers train (--mode local, simulate)."""
        if job.config.mode.value == "simulate":  # the same seed generators as the kernel's model
            import keras  # Keras: after the cell picks its backend

            keras.utils.set_random_seed(job.config.seed)
        ns = unpack(dict(job.contents.pushed))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            run_until_fit(self.cell, ns)
        if job.model_name not in ns:
            raise TrainingError(f"Running the cell again for the in-kernel worker did not "
                                f"define {job.model_name}; the cell must build its model every "
                                "time it runs.")
        return ns
