"""What a Run lets the notebook change while it trains: pause, resume, stop, the learning
rate, slow-downs, the batch policy, rule options, groups, workers and checkpoints. Each sends
one control message to the hub, which passes it to every worker on its next reply. Also the
checkpoints the monitor takes (`auto_checkpoint`), which are written as `run.checkpoint()`'s."""

from __future__ import annotations

import logging
import time

from nbdist.algorithms import make_rule
from nbdist.checkpoint.folder import claimed
from nbdist.checkpoint.store import save
from nbdist.core.dbs import POLICIES
from nbdist.core.stats import eval_row, wire_bytes
from nbdist.engine.learning_rate import schedule_replaced
from nbdist.errors import ConfigError, NbdistError, TrainingError
from nbdist.flag_values import parse_slowdown
from nbdist.modes import refuse_operation
from nbdist.run.elastic import add_workers
from nbdist.run.state import RunState
from nbdist.wire.messages import EvalResult

log = logging.getLogger("nbdist.run.handle")


class RunControl:
    """The control methods of a `Run` (see `nbdist.run.handle`), over its `state`."""

    state: RunState

    # -- control ----------------------------------------------------------------------------

    def pause(self) -> None:
        """Workers finish their current step and wait; nothing is pushed until resume()."""
        self._send(paused=True)

    def resume(self) -> None:
        self._send(paused=False)

    def stop(self) -> None:
        """End training early; the kernel's model still receives the weights reached so far.
        A run that has already ended is left as it is (stopping twice is not an error)."""
        state = self.state
        if state.ended.is_set():
            return
        state.stop_requested = True
        try:
            self._send(stop=True)
        except TrainingError:
            if not (state.ended.is_set() or state.control.closed):  # else it ended meanwhile
                raise

    def set_lr(self, lr: float, by: str | None = None) -> None:
        """Change the learning rate from the next push on (with --local-steps: the workers';
        in --mode sync: every rank's, at the same step). A learning-rate schedule in the cell is
        replaced by this constant rate from then on, and `run.warnings` says so. `by`: who asked,
        recorded with the `set_lr` event (e.g. a cell's ReduceLROnPlateau callback)."""
        # read before sending: in --mode local the worker shares this optimizer and may replace
        # the schedule as soon as the new rate reaches it
        state = self.state
        note = schedule_replaced(getattr(state.model, "optimizer", None), lr, state.warnings)
        self._send(lr=float(lr), **({"by": str(by)} if by else {}))
        if note:
            state.warnings.append(note)
            log.warning("run %s: %s", state.run_id, note)

    def release_epoch(self, epoch: int) -> None:
        """Let the workers start the epoch after `epoch` (0-based, of this run): a cell's fit
        call holds each epoch until the kernel has run its callbacks (`nbdist.fit.driver`)."""
        self._send(epoch_done=int(epoch))
        self.state.released_at = time.monotonic()  # the monitor polls fast while it trains

    def record_eval(self, epoch: int, metrics: dict) -> None:
        """Add a validation result computed in the kernel (a cell's fit call validates there)
        to the run's views: `history`'s `val_*` rows and the dashboard."""
        metrics = {k: float(v) for k, v in metrics.items()}
        state = self.state
        if state.control is not None and not state.ended.is_set():
            try:
                self._send(eval=EvalResult(epoch=int(epoch), metrics=metrics))
                return
            except TrainingError:
                if not state.ended.is_set():
                    raise
        # the last epoch is validated once the run has ended: its row goes into the views here
        snap = state.snapshot
        row = eval_row(metrics, epoch=int(epoch), version=-1,  # as the hub records the kernel's
                       step=int(snap.get("global_step", 0)), now=float(snap.get("elapsed", 0.0)),
                       wire_bytes=wire_bytes(snap.get("nodes", [])))
        state.snapshot = {**snap, "evals": [*snap.get("evals", []), row]}

    def set_slowdown(self, worker: int, factor: float) -> None:
        """Make `worker` behave `factor` times slower (1 = full speed), from its next step."""
        (factor,) = parse_slowdown([factor])
        self._check_worker(worker)
        self._send(slowdown=[int(worker), factor])

    def set_batch_policy(self, policy: str) -> None:
        """'dbs' (batch sizes in proportion to measured speed) or 'fixed'."""
        if policy not in POLICIES:
            raise ConfigError(f"Unknown batch policy {policy!r}. Expected one of: "
                              f"{', '.join(POLICIES)}.")
        self._send(batch_policy=policy)

    def set_option(self, name: str, value: float) -> None:
        """Change one of the update rule's hyper-parameters live (e.g. 'lambda0')."""
        snapshot = self.state.snapshot
        options = {**snapshot.get("rule_options", {}), name: value}
        workers = max(1, len(snapshot.get("nodes", [])))
        algorithm = self.state.config.rule_name
        rule = make_rule(algorithm, 0, workers, options)
        if name in rule.fixed_options:
            raise ConfigError(
                f"Option {name!r} of {algorithm} is fixed for the run: the workers act on it from "
                f"the start. Start a new run with --algo-opt {name}={value:g}.")
        self._send(option=[name, float(value)])

    def add_workers(self, engines) -> list[int]:
        """Start workers on more engines of the cluster while this async run trains; each pulls
        the current weights, takes chunks of what is left of the epochs, and shows up in `nodes`
        and on the dashboard. Returns their worker ids (M, M+1, ...). See nbdist/run/elastic.py.

        Example:
            >>> run.add_workers([3])                                  # doctest: +SKIP
            [2]
        """
        return add_workers(self, engines)

    def regroup(self) -> None:
        """Re-form the speed groups of `--algorithm group` from the current throughput."""
        algorithm = self.state.config.rule_name
        if algorithm != "group":
            raise ConfigError(f"regroup() needs --algorithm group (this run uses {algorithm}).")
        self._send(regroup=True)

    def checkpoint(self, directory: str | None = None) -> str:
        """Save the hub's state now (weights, rule state, versions, learning rate, data
        position) into `directory` (default: --checkpoint-dir); returns the checkpoint's path,
        for `nbdist.resume(path)`. After a failed run: the state the kernel kept (`run.error`
        says from when).

        Example:
            >>> path = run.checkpoint("ckpt")                        # doctest: +SKIP
            >>> run2 = nbdist.resume(path, cluster=cluster)          # doctest: +SKIP
        """
        state = self.state
        shown = "" if directory is None else repr(str(directory))
        refuse_operation(state.config.mode, "checkpoint", f"run.checkpoint({shown})")
        directory = directory if directory is not None else state.config.checkpoint_dir
        if directory is None:
            raise ConfigError("No checkpoint folder: pass one, run.checkpoint('ckpt'), or start "
                              "the run with --checkpoint-dir ckpt (checkpoint_dir='ckpt').")
        kept = state.kept[2] if state.kept is not None else None
        if state.ended.is_set() and state.status == "failed" and kept is not None:
            return save_checkpoint(state, str(directory), shards=kept)  # what the kernel kept
        if state.control is None or state.ended.is_set():
            raise TrainingError(f"The run is {state.status}; its hub is gone, so there is nothing "
                                f"to checkpoint. Its last checkpoint: {state.last_checkpoint}.")
        return save_checkpoint(state, str(directory))

    def _check_worker(self, worker: int) -> None:
        count = len(self.state.snapshot.get("nodes", []))
        if not (isinstance(worker, int) and 0 <= worker < max(count, 1)):
            raise ConfigError(f"No worker {worker!r}: this run has workers 0..{count - 1}.")

    def _send(self, **changes: object) -> None:
        state = self.state
        if state.control is None or state.ended.is_set():
            raise TrainingError(f"The run is {state.status}; there is nothing to control. "
                                "Start a new run.")
        state.control.control(**changes)


def save_checkpoint(state: RunState, directory: str, final: bool = False,
                    shards: list | None = None) -> str:
    """Write the run's checkpoint into `directory` now (`shards`: a state the kernel kept,
    instead of the hubs' now); returns its path. A folder another run holds is refused
    (nbdist.checkpoint.folder)."""
    # one at a time: in sync mode rank 0 holds the weights (nbdist.checkpoint.sync_state)
    with state.checkpoint_lock, claimed(directory, state.run_id, state.checkpoint_folder):
        if shards is None:
            shards = state.backend.checkpoint_state(state.control, final)
        state.last_checkpoint = save(directory, shards, state.checkpoint_info)
        state.checkpoint_at = time.monotonic()
    return state.last_checkpoint


def auto_checkpoint(state: RunState, final: bool = False) -> None:
    """Every --checkpoint-every seconds, and at the end; a failure warns, never kills training."""
    config = state.config
    every = config.checkpoint_interval
    if every is None or not (final or time.monotonic() - state.checkpoint_at >= every):
        return
    try:
        save_checkpoint(state, config.checkpoint_dir, final)
    except (NbdistError, OSError) as exc:  # e.g. NaN weights: the last good one stays
        state.checkpoint_at = time.monotonic()
        log.warning("run %s: checkpoint into %s failed: %s", state.run_id, config.checkpoint_dir,
                    exc)
        state.warnings.append(f"checkpoint not saved: {str(exc).splitlines()[0]}")
