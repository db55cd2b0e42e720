"""One pass from a cell to a job: everything the kernel decides before any engine is touched.

`prepare_job` takes a cell that has already run in the kernel (`nbdist.api._start` runs it, so
mistakes show at once and the notebook's own model exists; with a fit call, `prepare_job` is
called from inside that call, `nbdist.fit.launch`), finds what it provides
(`nbdist.engine.cell`), reads the model's flat layout and weights once, chooses the optimizer
and the weight constraints the hubs apply (refusing shard counts that would cut a constrained
variable) and who owns the learning rate, and checks a checkpoint against all that. The result,
a `Job`, is handed down to the mode's `start` (`nbdist.modes.MODES`); once the mode's backend
knows how many workers it has, `Job.for_workers` adds the coordinator's `Plan`.
Nothing below calls back up here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from nbdist.algorithms import make_rule, rule_class
from nbdist.algorithms.constraints import constrained_ranges
from nbdist.algorithms.group import MAX_RATIO
from nbdist.algorithms.momentum import correction_notice, worth_correcting
from nbdist.algorithms.optimizers import initial_rate, momentum_setting
from nbdist.algorithms.streaming import StreamingDiLoCo, overlap_steps, round_steps
from nbdist.config import Algorithm, Mode, TrainConfig
from nbdist.core.coordinator import Plan
from nbdist.core.sharding import shard_bounds
from nbdist.core.tail_average import tail_start
from nbdist.engine.batchnorm import PRECISE_SAMPLES, batchnorm_layers, recompute_batchnorm
from nbdist.engine.cell import CellContents, inspect_cell
from nbdist.engine.flat_layout import layout, read_flat
from nbdist.engine.keras_backend import kernel_backend
from nbdist.engine.layer_search import recurrent_layers
from nbdist.engine.learning_rate import check_lr, schedule_name
from nbdist.engine.optimizer_spec import choose_constraints, choose_optimizer
from nbdist.errors import ConfigError
from nbdist.fit.plan import sync_batches

if TYPE_CHECKING:
    from nbdist.checkpoint.store import Checkpoint
    from nbdist.fit.plan import FitSpec


# from this many async workers on, the run says at its start what staleness costs (measured at 4)
STALE_WORKERS = 4

@dataclass(frozen=True)
class Job:
    """What a run trains and how, as the kernel decided it (read-only from here on)."""

    config: TrainConfig
    cell: str  # the cell's source, as the engines run it
    namespace: dict  # where the cell ran in the kernel
    contents: CellContents  # its model and data, by name
    layout: dict  # the model's variable shapes (nbdist.engine.flat_layout.layout)
    params: np.ndarray  # the weights to start from: the cell's model's, or the checkpoint's
    non_trainable: np.ndarray
    optimizer: dict | None  # what the hubs apply; None where the workers keep the cell's
    # the Keras constraints the hubs apply after each update (nbdist.algorithms.constraints)
    constraints: list[dict]
    lr_owner: str  # "hub" or "workers" (`TrainConfig.lr_owner`)
    # the rate the workers are told when they own it; None: their schedule
    workers_rate: float | None
    warnings: list[str]  # for run.warnings: how this run trains unlike the cell
    checkpoint: Checkpoint | None = None  # when resuming: verified, before anything started
    fit: FitSpec | None = None  # the cell's own model.fit(...) call, when it made one
    # --mode local and simulate with a fit call: the cell run again in a namespace of its own,
    # so the workers train their own model while the kernel's holds each epoch's weights
    trainer_namespace: dict | None = None
    # the kernel's Keras backend: the run's (nbdist.engine.keras_backend)
    keras_backend: str = "tensorflow"
    # known once the mode's backend has counted its workers (`for_workers`)
    num_workers: int = 0
    plan: Plan | None = None
    rule_options: dict = field(default_factory=dict)
    easgd_alpha: float = 0.0

    @property
    def model(self):
        return self.contents.model

    @property
    def model_name(self) -> str:
        return self.contents.model_name

    @property
    def trainer_model(self):
        """The model the in-kernel workers train (--mode local, simulate): the kernel's own, or
        with a fit call the private copy (`trainer_namespace`)."""
        if self.trainer_namespace is None:
            return self.model
        return self.trainer_namespace[self.model_name]

    @property
    def epoch_size(self) -> int:
        """Samples per epoch: a pass over the data, or fewer (`fit(steps_per_epoch=...)`)."""
        size = self.fit.epoch_size if self.fit is not None else None
        return min(size, self.contents.num_samples) if size else self.contents.num_samples

    def worker_fields(self) -> dict:
        """What every worker spec (async, local, sync) takes from the job about its data."""
        contents, fit = self.contents, self.fit
        return dict(
            model_name=contents.model_name, data=contents.data,
            validation=contents.validation if fit is None else None,  # with a fit call: the kernel
            seed=self.config.seed, num_samples=contents.num_samples, stream=contents.streamed,
            shuffle=fit.shuffle if fit is not None else True,
            epoch_size=self.epoch_size if self.epoch_size != contents.num_samples else None,
            take_batches=fit.placed.take_batches if fit is not None else None,
            keras_backend=self.keras_backend)

    def streaming_fields(self) -> dict:
        """streaming-diloco's worker fields (`WorkerSpec.fragments`, `overlap_steps`, `mix`),
        from the rule's options; none for the other rules. The overlap takes at most a round's
        steps but one: the next round's chunks are what it trains on."""
        if self.plan is None or self.plan.algorithm != "streaming-diloco":
            return {}
        options = self._streaming_options()
        parts = int(options["fragments"])
        return dict(fragments=parts, mix=float(options["mix"]),
                    overlap_steps=overlap_steps(self.config.local_steps, parts,
                                                options["overlap"]))

    def _streaming_options(self) -> dict:
        """streaming-diloco's options: those given over the rule's defaults."""
        return {**StreamingDiLoCo.default_options(self.num_workers), **self.rule_options}

    def for_workers(self, num_workers: int) -> Job:
        """This job for `num_workers` workers: the rule (where --algorithm was left to nbdist),
        the coordinator's plan and the rule's options."""
        picked = self.default_rule(num_workers) if self.config.algorithm is None else {}
        config = self.config.replace(**picked) if picked else self.config
        plan, options, alpha = coordinator_plan(config, self.contents, self.workers_rate,
                                                num_workers, epoch_size=self.epoch_size,
                                                kernel_validates=self.fit is not None)
        if plan.momentum_correction and config.momentum_correction is None:
            # one worker has no asynchrony to take out (--mode local: fit's own updates)
            plan = replace(plan, momentum_correction=num_workers > 1
                           and self.momentum_worth_correcting(num_workers))
        job = replace(self, config=config, num_workers=num_workers, plan=plan,
                      rule_options=options, easgd_alpha=alpha)
        return job.told([*job.momentum_notices(), *job.staleness_notices(),
                         *job.recurrent_notices(picked), *job.tail_notices(),
                         *job.round_notices(),
                         *job.batchnorm_notices()])

    def told(self, said: list[str]) -> Job:
        """This job with `said` in run.warnings and run.events: how the run trains unlike the
        cell, said at its start."""
        if not said:
            return self
        return replace(self, warnings=[*self.warnings, *said],
                       contents=replace(self.contents, notes=[*self.contents.notes, *said]))

    def default_rule(self, num_workers: int) -> dict:
        """The options that pick the rule where --algorithm was not given (none in a mode
        without one: sync, pipeline). asgd, except for a recurrent net at plain SGD with 2 or
        more async workers, where a push one update late keeps asgd on the loss plateau that
        fit leaves (an Embedding + LSTM at SGD(0.5): 0.47-0.88 over 5 seeds, fit 1.000):
        - with the cell's fit call and its batch: softsync --n 1, the workers sharing the
          call's batch, so that each update is the mean gradient over the call's batch, as
          --mode sync makes it (1.000 on 5 seeds of 5 with 2 workers, twice; 5 runs of 6
          with 4 on 2 cores);
        - else dc-asgd-a, whose curvature term corrects the late gradient (1.000 on 4 seeds of
          5, 0.73 on the fifth). docs/performance.md, "Parity with model.fit"."""
        config = self.config
        if not config.has_rule:
            return {}
        if (num_workers < 2 or not self._plain_sgd or not recurrent_layers(self.model)
                or config.algo_options or config.predict_weights or config.local_steps > 1):
            return {"algorithm": Algorithm.ASGD}  # --algo-opt, --predict-weights: asgd's
        if self.fit is not None and self.fit.batch_from_call:
            each, _ = sync_batches(self.fit.batch, num_workers)
            picked = {"algorithm": Algorithm.SOFTSYNC, "n": 1, "batch_size": each}
        else:
            picked = {"algorithm": Algorithm.DC_ASGD_A}
        try:
            config.replace(**picked)
        except ConfigError:  # an option the picked rule does not take (--batch-min, ...)
            return {"algorithm": Algorithm.ASGD}
        return picked

    @property
    def _plain_sgd(self) -> bool:
        """Whether the hub applies SGD without momentum (the cell's, or --server-optimizer's)."""
        optimizer = self.optimizer
        return (optimizer is not None and optimizer["class_name"] == "SGD"
                and momentum_setting(optimizer) is None)

    def momentum_worth_correcting(self, num_workers: int) -> bool:
        """--momentum-correction's default for the cell's optimizer and `num_workers`
        (`worth_correcting`: SGD with momentum at a large effective step for the delays)."""
        setting = momentum_setting(self.optimizer) if self.optimizer is not None else None
        return setting is not None and worth_correcting(
            self.optimizer["class_name"], setting[1], initial_rate(self.optimizer), num_workers)

    def momentum_notices(self) -> list[str]:
        """How momentum compensation changes the cell's optimizer (nothing where it is off or
        the optimizer has no momentum)."""
        if not self.plan.momentum_correction or self.optimizer is None:
            return []
        setting = momentum_setting(self.optimizer)
        if setting is None:
            return []
        note, extra = correction_notice(self.optimizer["class_name"], *setting,
                                        self.num_workers)
        return [note] if extra is None else [note, extra]

    def staleness_notices(self) -> list[str]:
        """What many async workers cost at equal epochs, measured, said at the start."""
        if not self.config.momentum_correction_works:
            return []  # a rule that averages or syncs pushes, or a mode without a hub rule
        workers = self.num_workers
        if workers < STALE_WORKERS:
            return []
        return [f"{workers} async workers: each push lands about {workers - 1} updates after "
                f"the read it was computed on. At equal epochs that staleness cost 0.02-0.07 of "
                f"test accuracy against model.fit with 4 workers, with every optimizer, plain "
                f"SGD included (a Fashion-MNIST MLP, docs/performance.md, \"Parity with "
                f"model.fit\"). To track fit, pick --mode sync, fewer workers, or "
                f"--algorithm ssp --staleness 0 (shorter delays; workers wait for the slowest), "
                f"or train more epochs."]

    def recurrent_notices(self, picked: dict) -> list[str]:
        """A recurrent net trained with plain SGD by workers whose every push lands late, said
        at the start: the rule nbdist `picked` for it (`default_rule`), or, where --algorithm
        named a rule without delay compensation, the gap measured with it."""
        config = self.config
        if self.num_workers < 2 or not self._plain_sgd or not config.has_rule:
            return []
        recurrent = recurrent_layers(self.model)
        if not recurrent:
            return []
        said = (f"The model has a recurrent layer ({type(recurrent[0]).__name__}) trained with "
                f"plain SGD by {self.num_workers} async workers: each push would land at least "
                f"one update late, which halves the largest learning rate that stays stable. "
                f"An Embedding + LSTM cell at SGD(0.5) that model.fit trains to 1.000 stayed on "
                f"its loss plateau this way with asgd (0.47-0.88 over 5 seeds; "
                f"docs/performance.md, \"Parity with model.fit\").")
        rule = picked.get("algorithm")
        if rule is Algorithm.SOFTSYNC:
            _, uneven = sync_batches(self.fit.batch, self.num_workers)
            shared = (f"{said} So the hub averages the {self.num_workers} workers' pushes "
                      f"into one update (--algorithm softsync --n 1), each worker computing "
                      f"{config.batch_size} samples of model.fit(batch_size={self.fit.batch}): "
                      f"each update is the mean gradient over the call's batch, as in --mode "
                      f"sync (1.000 on 5 seeds of 5 with 2 workers). --algorithm asgd keeps "
                      f"asynchronous SGD with the call's batch per worker.")
            return [*([uneven] if uneven else []), shared]
        if rule is Algorithm.DC_ASGD_A:
            return [f"{said} So the hub applies --algorithm dc-asgd-a, whose curvature term "
                    f"corrects each late gradient (1.000 on 4 seeds of 5 with 2 workers, 0.73 "
                    f"on the fifth); with a fit call and its own batch, nbdist averages the "
                    f"workers' pushes instead, as --mode sync does. --algorithm asgd keeps "
                    f"asgd."]
        if rule_class(config.rule_name).compensates_delay or not config.momentum_correction_works:
            return []  # a rule that corrects or averages late pushes
        return [f"{said} To track fit, leave --algorithm out (nbdist then picks a rule for "
                f"late pushes), or pick --mode sync, or a lower learning rate."]

    def round_notices(self) -> list[str]:
        """How a round of local steps (diloco's, async-local-sgd's) trains this cell: how many
        inner steps a round takes, and with which outer optimizer, where an epoch holds fewer
        than --local-steps (the round then ends with the worker's share of the epoch)."""
        plan, config = self.plan, self.config
        if not (plan.shares_rounds and plan.local_steps > 1):
            return []
        share = -(-plan.num_samples // (plan.batch_size * plan.num_workers))
        rounds = (f"each round takes {plan.local_steps} inner steps per worker"
                  if plan.local_steps <= share else
                  f"an epoch gives each worker {share} steps, fewer than --local-steps "
                  f"{plan.local_steps}: each round is its share of an epoch")
        if not plan.syncs_groups:
            given = self.rule_options
            every, rate = given.get("buffer", plan.num_workers), given.get("outer_lr", 0.7)
            return [f"--algorithm {plan.algorithm}: {rounds}, with the cell's optimizer on the "
                    f"workers; the hub applies each worker's delta as it lands, and every "
                    f"{every} deltas their mean's Nesterov momentum (delayed Nesterov, outer "
                    f"rate {rate:g}, momentum {given.get('momentum', 0.9):g})."]
        if plan.algorithm == "streaming-diloco":
            fields = self.streaming_fields()
            given = self._streaming_options()
            parts, steps = fields["fragments"], round_steps(plan.local_steps, fields["fragments"])
            every = (f"one every {steps} inner steps, so each fragment every {steps * parts}"
                     if steps <= share else f"one per round, each round its share of an epoch "
                     f"({share} steps, fewer than {steps})")
            return [f"--algorithm streaming-diloco: the weights sync in {parts} fragments, "
                    f"{every}, with the cell's optimizer on the workers; the hub averages the "
                    f"{plan.num_workers} workers' deltas of a fragment and steps Nesterov on it "
                    f"(outer rate {given['outer_lr']:g}, momentum {given['momentum']:g}); each "
                    f"worker trains {fields['overlap_steps']} more step(s) while a fragment is "
                    f"in flight, then mixes it in (alpha {fields['mix']:g})."]
        outer = getattr(config.server_optimizer, "value", config.server_optimizer)
        return [f"--algorithm {plan.algorithm}: {rounds}, with the cell's optimizer on the "
                f"workers; the hub averages the {plan.num_workers} workers' deltas and steps "
                f"--server-optimizer {outer} on their mean."]

    def tail_notices(self) -> list[str]:
        """That the weights handed back average the run's tail (nothing where they don't)."""
        plan = self.plan
        if tail_start(plan.average_tail, plan.epochs, plan.num_samples) is None:
            return []
        return [f"--average-tail {plan.average_tail:g}: the weights handed back are the mean over "
                f"the run's last {plan.average_tail:.0%} of samples, not the last update's, "
                f"which asynchronous pushes leave scattered (about 0.04 of accuracy around "
                f"model.fit's); --average-tail 0 keeps the last."]

    @property
    def precise_bn(self) -> bool:
        """Whether the kernel recomputes the model's BatchNorm statistics at the weights the run
        hands it (`settle_model`): --precise-bn, or by default in the modes that take it, for a
        model with BatchNormalization whose training data is in memory."""
        return (self.config.precise_bn_wanted and self.contents.arrays is not None
                and bool(batchnorm_layers(self.model)))

    def batchnorm_notices(self) -> list[str]:
        """What precise BatchNorm statistics change, or why they could not be had."""
        if self.precise_bn:
            count = len(batchnorm_layers(self.model))
            rows = min(PRECISE_SAMPLES, self.contents.num_samples)
            return [f"--precise-bn: the moving statistics of the model's {count} "
                    f"BatchNormalization layer{'s' if count != 1 else ''} are recomputed at the "
                    f"weights the run hands the notebook{' (each epoch)' if self.fit else ''}, "
                    f"over {rows:,} training samples, instead of the moving averages the hub "
                    f"gathered while the weights moved, which lag them and made single runs "
                    f"land up to 0.15 apart. --no-precise-bn keeps the moving averages."]
        if self.config.precise_bn and self.contents.arrays is None:
            return ["--precise-bn needs the training data in memory, and this run streams it: "
                    "the model keeps the moving averages of its BatchNorm statistics. Load the "
                    "data as arrays (or take() a part of the dataset) to have them recomputed."]
        return []

    def settle_model(self, model) -> None:
        """Precise BatchNorm statistics for `model`, which holds the run's weights now."""
        recompute_batchnorm(model, self.contents.arrays[0], self.config.batch_size)

    def checkpoint_info(self, run_id: str) -> dict:
        """What every checkpoint of this run records beside the hubs' state."""
        return {"run_id": run_id, "config": self.config.to_dict(), "cell": self.cell,
                "model_name": self.model_name, "layout": self.layout,
                "num_samples": self.contents.num_samples, "num_workers": self.num_workers,
                "resumed_from": self.checkpoint.path if self.checkpoint is not None else None,
                "fit_call": self.fit.ordinal if self.fit is not None else 0}


def prepare_job(cell: str, config: TrainConfig, ns: dict, checkpoint: Checkpoint | None = None, *,
                fit: FitSpec | None = None, **found) -> Job:
    """Decide everything about the job of `cell`, which has run in `ns` (up to its fit call, if it
    makes one: `fit`). It does not run the cell: `nbdist.api._start` has (and, for the
    in-kernel workers of a fit call, `FitLauncher` runs it again); it raises before any engine is
    touched (a CellError, ConfigError, CheckpointError, ... that says what to fix). `found`:
    what the fit call named where no flag overrides it (`inspect_cell`'s data, validation,
    model_name, take_batches)."""
    keras_backend = kernel_backend(config.mode.value)  # refuses a mode the backend cannot run
    contents = inspect_cell(cell, ns, config, **found)
    notes = [f"Keras backend: {keras_backend} (the kernel's; every worker runs the cell on it)"]
    if config.weights_predicted and (config.mode.value != "local" or config.overlap):
        notes.append("--predict-weights: a worker computes its gradient at w + d x (the hub's "
                     "last update), d its recent delay (--no-predict-weights: at w itself)")
    contents = replace(contents, notes=[*contents.notes, *notes])
    if fit is not None and contents.batch_hint and "batch_size" not in fit.call.given \
            and fit.batch == fit.call.batch and config.batch_size == fit.batch:
        # fit(dataset): the dataset's own batches are the model's batch, as in Keras
        fit = replace(fit, batch=contents.batch_hint)
        config = config.replace(batch_size=contents.batch_hint)
    model = contents.model
    shape = layout(model)
    # a resume keeps the saved rate
    check_lr(config.lr if checkpoint is None else None, model.optimizer)
    segments = [math.prod(s) for s in shape["trainable"]]
    optimizer, warnings = choose_optimizer(config, model.optimizer, segments,
                                           list(model.trainable_variables))
    constraints = choose_constraints(config, list(model.trainable_variables))
    # refuses now what cannot be split
    shard_bounds(sum(segments), config.servers, whole=constrained_ranges(constraints))
    params, non_trainable = read_flat(model)
    if checkpoint is not None:
        checkpoint.check_fits(shape, contents.num_samples, config.servers)
        checkpoint.check_optimizer(optimizer)
        params, non_trainable = checkpoint.params, checkpoint.non_trainable
    return Job(config=config, cell=cell, namespace=ns, contents=contents, layout=shape,
               params=params, non_trainable=non_trainable, optimizer=optimizer,
               constraints=constraints, lr_owner=config.lr_owner,
               workers_rate=workers_rate(config, model.optimizer),
               warnings=contents.warnings + warnings, checkpoint=checkpoint, fit=fit,
               keras_backend=keras_backend)


def cell_rate(optimizer) -> float:
    """The cell optimizer's rate now (a schedule's value at its current step)."""
    return float(np.asarray(optimizer.learning_rate))


def workers_rate(config: TrainConfig, cell_optimizer) -> float | None:
    """The rate the coordinator tells workers that own it (None: they keep their optimizer's
    own rate or schedule); unused when the hub owns the rate."""
    if config.lr is None and schedule_name(cell_optimizer) is not None:
        return None
    return config.lr if config.lr is not None else cell_rate(cell_optimizer)


def _chunks_ahead(config: TrainConfig, declared: dict) -> int:
    """The chunks a worker may hold: a round of local steps (streaming-diloco's: a fragment's
    K steps and the overlap's), two with --overlap, else one."""
    if "fragments" in declared and config.rule is Algorithm.STREAMING_DILOCO:
        steps = round_steps(config.local_steps, int(declared["fragments"]))
        return steps + overlap_steps(config.local_steps, int(declared["fragments"]),
                                     declared["overlap"])
    if config.local_steps > 1:
        return config.local_steps
    return 2 if config.overlap else 1


def coordinator_plan(config: TrainConfig, contents: CellContents, lr: float | None,
                     num_workers: int, *, epoch_size: int | None = None,
                     kernel_validates: bool = False) -> tuple[Plan, dict, float]:
    """The coordinator's plan, the rule's options and EASGD's alpha for this run. `epoch_size`:
    samples per epoch when not a whole pass; `kernel_validates`: the kernel evaluates each
    epoch itself (a cell's fit call), so no worker is asked to."""
    if config.slowdown is not None and len(config.slowdown) != num_workers:
        raise ConfigError(
            f"--slowdown gives {len(config.slowdown)} factor(s) for {num_workers} worker(s). "
            f"Give one per worker, e.g. --slowdown {','.join(['1'] * num_workers)}."
        )
    algorithm = config.rule_name
    options = config.rule_options()
    rule = make_rule(algorithm, 0, num_workers, options)  # bounds that depend on the workers
    declared = rule.options  # the given options over the rule's own defaults
    easgd_alpha = float(declared["alpha"]) if config.rule is Algorithm.EASGD else 0.0
    plan = Plan(
        num_workers=num_workers, num_samples=epoch_size or contents.num_samples,
        epochs=config.epochs, batch_size=config.batch_size, lr=lr,
        has_validation=contents.validation is not None and not kernel_validates,
        algorithm=algorithm,
        staleness=declared.get("staleness"),  # ssp's S
        groups=int(declared.get("num_groups", 0)),
        max_group_ratio=float(declared.get("max_ratio", MAX_RATIO)),
        chunks_ahead=_chunks_ahead(config, declared),
        local_steps=config.local_steps,
        overlap=config.overlap,
        # default floor: a quarter of the batch. When a slow node's fixed cost per step alone
        # is as long as a fast node's whole step, equal step times would mean 1-sample batches,
        # whose gradients are mostly noise; --batch-min 1 allows that if wanted.
        dbs=config.dbs, batch_min=config.batch_min or max(1, config.batch_size // 4),
        batch_max=config.batch_max,
        slowdown=list(config.slowdown or [1.0] * num_workers), staleness_lr=config.staleness_lr,
        predict_weights=config.weights_predicted,
        momentum_correction=config.momentum_corrected,
        average_tail=config.tail_fraction(num_workers),
        metrics=config.metrics.value, lr_owner=config.lr_owner, pause_at=config.pause_at,
        # sync ranks fall silent together whenever rank 0 evaluates (the others wait in the
        # allreduce): that is no loss, and Horovod itself fails a rank that hangs
        silence_is_loss=config.mode is not Mode.SYNC, epoch_gate=kernel_validates)
    return plan, options, easgd_alpha
