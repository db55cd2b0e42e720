"""TrainConfig: every option of a run, validated once at the edge.

The magic and `nbdist.train` both build a `TrainConfig`; everything behind them (hub,
workers, Run) trusts it. The choices (enums, plain strings: `--mode async`, `mode="async"` and
`Mode.ASYNC` are the same thing) live in `nbdist.choices` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os

from nbdist.choices import (  # also re-exported: nbdist.config is where callers find them
    Algorithm,
    Collective,
    Metrics,
    Mode,
    Pin,
    ServerOptimizer,
    Spin,
    Transport,
)
from nbdist.choices import choice as _choice
from nbdist.declarations import auto_or_int, late, option
from nbdist.errors import ConfigError
from nbdist.flag_values import parse_names, parse_options, parse_size, parse_slowdown
from nbdist.modes import mode_spec, modes_taking, refuse_flags

MAX_WORKERS = 1_000_000  # for checking rule options before the number of workers is known
CHECKPOINT_EVERY_S = 60.0  # between periodic checkpoints when --checkpoint-every is not given
DILOCO_INNER_STEPS = 500  # H, DiLoCo's inner steps per round (Douillard et al. 2023)
# H of streaming-diloco: the inner steps between two syncs of one fragment (Douillard et al. 2025)
STREAMING_INNER_STEPS = 100
# what a fragment's push may travel as: a codec whose frame is a pure function of the fragment
# (error feedback and powersgd keep state per whole slice)
STREAMING_CODECS = ("none", "fp16", "int8")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One run's options. Build with `TrainConfig(...)`; invalid values raise ConfigError.

    Example:
        >>> TrainConfig(mode="async", workers=2, epochs=1, batch_size=64).rule
        <Algorithm.ASGD: 'asgd'>
    """

    mode: Mode = option(
        Mode.ASYNC, "where the run trains: async, nbdist's parameter server on the cluster; sync, "
        "Horovod allreduce between the cluster's engines; local, in this kernel; simulate, "
        "virtual workers on a virtual clock, in this kernel; pipeline, the model cut into stages, "
        "one engine each", choices=Mode)
    algorithm: Algorithm | str | None = option(
        None, "update rule the hub applies to each push: a built-in one, or a subclass of "
        "nbdist.Rule defined in the notebook (the class, or its name)", choices=Algorithm,
        open_choices=True,
        shown_default="asgd; for a recurrent net at plain SGD with 2 or more async workers, "
        "softsync --n 1 with the workers sharing the fit call's batch (dc-asgd-a without one)")
    workers: int | None = option(
        None, "number of workers", type=int,
        shown_default="every free engine; local: 1; simulate: one per --slowdown")
    servers: int = option(1, "parameter shards, one hub engine each", type=int)
    epochs: int = option(1, "passes over the data", type=int)
    batch_size: int = option(32, "samples per worker step (pipeline: per mini-batch)", type=int)
    lr: float | None = option(None, "learning rate", type=float,
                              shown_default="the cell's optimizer's")
    model: str | None = option(None, "variable holding the model",
                               shown_default="the one compiled model the cell defines")
    data: tuple[str, ...] = option(("x_train", "y_train"), "training arrays X,Y, or one "
                                   "tf.data.Dataset or generator function NAME")
    validation: tuple[str, ...] | None = option(
        None, "validation arrays X,Y, or one dataset NAME",
        shown_default="x_test,y_test if the cell defines them")
    in_memory_limit: int | str = option("2GiB", "a dataset larger than this (decoded) is streamed "
                                        "by shards, e.g. 500MB")
    no_validation: bool = option(False, "skip validation", switch=True)
    seed: int = option(0, "seed of the epoch permutations (simulate: of the cell's weights too)",
                       type=int)
    transport: Transport = option(
        Transport.AUTO, "how parameters and gradients travel: auto, shared memory on the same "
        "host and TCP across hosts; tcp; shm, same host only",
        choices=Transport)
    compression: str = option(
        "none", "what crosses the network for parameters and gradients (the hub keeps "
        "float32): fp16, half the bytes; int8, a quarter; topk:RATIO or randomk:RATIO, that "
        "share of the entries, with error feedback; qsgd:LEVELS, stochastic levels in a byte; "
        "powersgd:RANK, each weight matrix as rank-RANK factors, with error feedback. "
        "Sync sums fp16 and powersgd in its allreduce, and gathers the others' frames",
        metavar="CODEC")
    timeout: float = option(120.0, "seconds a hub or worker may stay silent before the run "
                            "fails", type=float)
    algo_options: dict = option({}, "the rule's hyper-parameters, e.g. lambda0=2,momentum=0.9",
                                flag="--algo-opt", metavar="NAME=X",
                                shown_default="the rule's own")
    staleness_lr: bool = option(False, "divide the learning rate by each push's delay",
                                switch=True)
    predict_weights: bool | None = option(
        None, "workers compute each gradient at the weights predicted for when it lands, "
        "w + d x (the hub's last update) with d their recent delay, so that staleness under a "
        "momentum optimizer (Adam) costs as little as possible", negatable=True,
        shown_default=late("nbdist.algorithms", "prediction_default"))
    momentum_correction: bool | None = option(
        None, "lower the optimizer's momentum (SGD's and RMSprop's momentum, Adam's beta_1) by "
        "the momentum the workers' asynchrony adds, d/(1+d) for a mean delay d, so the total "
        "stays the cell's (Mitliagkas et al. 2016); run.warnings says what was applied",
        negatable=True, shown_default=late("nbdist.algorithms", "momentum_correction_default"))
    precise_bn: bool | None = option(
        None, "recompute each BatchNormalization layer's moving statistics at the weights the run "
        "hands the notebook (at each epoch's end with a fit call), over 8,192 training samples, "
        "instead of keeping the moving averages the hub gathered while the weights moved "
        "(precise BN); run.warnings says so", negatable=True,
        shown_default="on where the model has BatchNormalization and the data is in memory")
    average_tail: float | None = option(
        None, "hand back the mean of the hub's weights over the run's last FRACTION of samples "
        "(tail averaging, Polyak and Juditsky) instead of where the last asynchronous pushes "
        "happened to leave them; 0: the last update's weights; run.warnings says so",
        type=float, metavar="FRACTION",
        shown_default="0.1 with two or more workers pushing one step at a time (asgd, "
        "hogwild, ssp, dc-asgd, dc-asgd-a), where the data's length is known")
    staleness: int | None = option(None, "ssp: clocks a worker may run ahead", type=int,
                                   shown_default="the rule's own")
    n: int | None = option(None, "softsync: apply the mean of every M//n pushes", type=int,
                           shown_default="the rule's own")
    groups: int | str = option("auto", "group: a number of groups, or auto (from measured "
                               "speeds)", type=auto_or_int, metavar="auto|N")
    local_steps: int = option(1, "steps with the cell's optimizer per exchange", type=int)
    server_optimizer: ServerOptimizer | None = option(
        None, "the hub's optimizer instead of the cell's (with --local-steps, SGD at rate 1 on "
        "the deltas unless given)", choices=ServerOptimizer, shown_default="the cell's")
    overlap: bool = option(False, "push step t while computing step t+1", switch=True)
    # pin: off until measured faster (benchmarks/overhead.py --pin both)
    pin: Pin = option(Pin.OFF, "auto: one core per hub shard, the rest split between the "
                      "workers on each host; off: the OS places every thread",
                      choices=Pin)
    spin: Spin = option(Spin.AUTO, "auto: a hub shard with a core of its own, and its workers "
                        "on the same host, poll for messages instead of sleeping; off: they "
                        "sleep", choices=Spin)
    dbs: bool = option(False, "batch sizes in proportion to measured speed",
                       switch=True)
    batch_min: int | None = option(None, "DBS floor", type=int,
                                   shown_default="batch-size // 4")
    batch_max: int | None = option(None, "DBS ceiling", type=int,
                                   shown_default="workers x batch-size")
    slowdown: tuple[float, ...] | None = option(None, "per-worker slow-down factors, e.g. 1,2,4",
                                                shown_default="none")
    metrics: Metrics = option(Metrics.FULL, "full: history row, timeline row and delay "
                              "statistics per push; minimal: counters only",
                              choices=Metrics)
    pause_at: int | None = option(
        None, "pause once the hub has counted N steps (run.stats['global_step']), as "
        "run.pause() would, to look at a run at a known step; run.resume() goes on. 0: start "
        "paused", type=int, metavar="N", shown_default="never")
    elastic: bool = option(False, "engines that join the cluster while the run trains become "
                           "workers", switch=True)
    checkpoint_dir: str | None = option(None, "folder for checkpoints of the run's state",
                                        metavar="FOLDER")
    checkpoint_every: float | None = option(
        None, "seconds between checkpoints", type=float,
        shown_default=f"{CHECKPOINT_EVERY_S:g} with --checkpoint-dir")
    sim: dict = option({}, "the virtual clock and its links: name=number pairs", metavar="NAME=X",
                       shown_default=late("nbdist.core.simclock", "sim_defaults"))
    # off: with it, no gain beyond the seeds' spread in accuracy on a BatchNorm CNN, and 30-40%
    # more time per step (an allreduce per BatchNorm layer each way; benchmarks/sync_batchnorm.py)
    collective: Collective = option(
        Collective.AUTO, "sync: what averages the gradients: horovod (Horovod's allreduce inside "
        "TensorFlow graphs; TensorFlow only), torch (torch.distributed over Gloo, on every Keras "
        "backend), auto (horovod on TensorFlow where it is installed, else torch)",
        choices=Collective)
    sync_batchnorm: bool = option(False, "BatchNorm statistics over the global batch, allreduced "
                                  "in the forward pass", negatable=True)
    stages: int = option(2, "stages, one engine each", type=int)
    micro_batches: int = option(4, "micro-batches per mini-batch; must divide --batch-size",
                                type=int)
    partition: str = option("measured", "how layers are cut into stages: measured (the cost "
                            "model's best cuts, timed as whole stages before training) or one "
                            "from the profile alone", choices=late("nbdist.core.partition",
                                                                   "PARTITIONS"))
    schedule: str = option("gpipe", "gpipe: all forwards, then all backwards; 1f1b: one forward "
                           "and one backward in turn",
                           choices=late("nbdist.core.partition", "SCHEDULES"))

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "mode", _choice(Mode, self.mode, "--mode"))
        if self.algorithm is not None:  # None: nbdist picks (nbdist.job.Job.default_rule)
            set_(self, "algorithm", _algorithm(self.algorithm))
        set_(self, "transport", _choice(Transport, self.transport, "--transport"))
        set_(self, "compression", _codec(self.compression))
        set_(self, "collective", _choice(Collective, self.collective, "--collective"))
        set_(self, "pin", _choice(Pin, self.pin, "--pin"))
        set_(self, "spin", _choice(Spin, self.spin, "--spin"))
        if self.server_optimizer is not None:
            set_(self, "server_optimizer", _choice(ServerOptimizer, self.server_optimizer,
                                                   "--server-optimizer"))
        set_(self, "metrics", _choice(Metrics, self.metrics, "--metrics"))
        set_(self, "algo_options", parse_options(self.algo_options))
        set_(self, "slowdown", parse_slowdown(self.slowdown))
        from nbdist.core.simclock import parse_sim  # NumPy: not at `import nbdist`

        set_(self, "sim", parse_sim(self.sim))
        set_(self, "data", parse_names(self.data, "--data"))
        set_(self, "validation", parse_names(self.validation, "--validation"))
        set_(self, "in_memory_limit", parse_size(self.in_memory_limit))
        for flag, value, low in (("--epochs", self.epochs, 1), ("--batch-size", self.batch_size, 1),
                                 ("--servers", self.servers, 1), ("--seed", self.seed, 0)):
            _check_int(flag, value, low)
        if self.workers is not None:
            _check_int("--workers", self.workers, 1)
        if self.pause_at is not None:
            _check_int("--pause-at", self.pause_at, 0)
        if self.lr is not None and (isinstance(self.lr, bool)
                                    or not isinstance(self.lr, (int, float))
                                    or not (math.isfinite(self.lr) and self.lr > 0)):
            raise ConfigError(
                f"--lr must be a positive finite number (Received: {self.lr!r}). "
                "Try a value such as 0.01, or leave it out to use the cell's optimizer's rate."
            )
        if self.model is not None and not str(self.model).isidentifier():
            raise ConfigError(f"--model expects a Python name (Received: {self.model!r}).")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not (
                math.isfinite(self.timeout) and self.timeout > 0):
            raise ConfigError(f"--timeout must be a positive finite number of seconds (Received: "
                              f"{self.timeout!r}). Example: --timeout 120.")
        if self.sync_batchnorm is None:  # as checkpoints before 0.1.0's declarations saved "off"
            set_(self, "sync_batchnorm", False)
        for flag, value in (("sync_batchnorm", self.sync_batchnorm), ("elastic", self.elastic)):
            if not isinstance(value, bool):
                raise ConfigError(f"{flag} must be True or False (Received: {flag}={value!r}).")
        if self.algorithm in (Algorithm.DILOCO, Algorithm.ASYNC_LOCAL_SGD,
                              Algorithm.STREAMING_DILOCO):
            self._local_sgd_recipe()
        refuse_flags(self.mode, self._given())  # an option the mode does not take (nbdist.modes)
        self._check_algorithm_options()
        self._check_checkpoints()
        if self.mode is Mode.LOCAL and (self.workers or 1) != 1:
            raise ConfigError(
                f"--mode local trains with one worker inside this kernel (Received: --workers "
                f"{self.workers}). Use --mode async with a cluster (%nbdist start N) for more."
            )

        simulated_sync = self.mode is Mode.SIMULATE and self.sim.get("sync")
        if simulated_sync and self.compression.startswith("powersgd"):
            raise ConfigError(
                f"--sim sync=1 simulates a ring allreduce of the gradient (float32, fp16) or an "
                f"allgather of the workers' frames (int8, qsgd, topk, randomk), but not "
                f"--compression {self.compression}'s two allreduces of its factors. Drop --sim "
                f"sync=1 to simulate {self.compression} in async, or train it in --mode sync.")
        if self.mode is Mode.SIMULATE:
            self._check_simulate()
        if self.mode is Mode.PIPELINE:
            # NumPy: not at `import nbdist`
            from nbdist.core.partition import check_pipeline_options

            check_pipeline_options(
                stages=self.stages, micro_batches=self.micro_batches, method=self.partition,
                kind=self.schedule, batch_size=self.batch_size)

    def _given(self) -> list[tuple[str, str, str]]:
        """(option, its flag, its value as written) for each option away from its default."""
        given = []
        for field in dataclasses.fields(self):
            default = (field.default_factory() if field.default is dataclasses.MISSING
                       else field.default)
            value = getattr(self, field.name)
            if value != default:
                declared = field.metadata["flag"]
                flag = declared.get("flag") or "--" + field.name.replace("_", "-")
                if isinstance(value, bool):  # a switch: --overlap, --no-predict-weights
                    flag, shown = (flag if value else f"--no-{flag[2:]}"), ""
                else:
                    shown = ",".join(map(str, value)) if isinstance(value, tuple) else (
                        ",".join(f"{k}={v:g}" for k, v in value.items())
                        if isinstance(value, dict) else str(getattr(value, "value", value)))
                given.append((field.name, flag, shown))
        return given

    def _check_simulate(self) -> None:
        if self.workers is None and self.slowdown is None:
            raise ConfigError("--mode simulate needs the number of virtual workers: pass "
                              "--workers N (or --slowdown with one factor per worker).")
        if self.rule is Algorithm.EASGD:
            raise ConfigError(
                "--mode simulate runs one parameter vector with one gradient step per push, so "
                "--algorithm easgd (an elastic pull between the workers' own copies) does not "
                "apply. Pick another --algorithm, or use --mode async with a cluster.")
        if self.sim.get("sync") and self.algorithm not in (None, Algorithm.ASGD):
            raise ConfigError(f"--sim sync=1 simulates --mode sync (one mean gradient per step), "
                              f"which has no --algorithm (Received: {self.rule_name}). "
                              "Drop --algorithm.")

    def _check_algorithm_options(self) -> None:
        _check_int("--local-steps", self.local_steps, 1)
        for flag, value, low in (("--staleness", self.staleness, 0), ("--n", self.n, 1),
                                 ("--batch-min", self.batch_min, 1),
                                 ("--batch-max", self.batch_max, 1)):
            if value is not None:
                _check_int(flag, value, low)
        if self.groups != "auto":
            _check_int("--groups", self.groups, 1)
        low, high = self.batch_min or 1, self.batch_max or self.batch_size
        if not low <= self.batch_size <= high:
            raise ConfigError(
                f"--batch-size {self.batch_size} must lie within --batch-min {low} and --batch-max "
                f"{high}. Widen the bounds or change --batch-size."
            )
        # the rules' catalogue (NumPy: imported once a config is built, not at `import nbdist`)
        from nbdist.algorithms import CUSTOM, make_rule, rule_class, rules_that

        algo = self.rule_name
        if self.local_steps > 1 and not rule_class(algo).takes_local_steps:
            raise ConfigError(
                f"--local-steps works with {', '.join(rules_that('takes_local_steps'))}, whose "
                f"update is linear in what is pushed (Received: --algorithm {algo}). Use one of "
                "those, or --local-steps 1."
            )
        if self.overlap and self.local_steps > 1:
            raise ConfigError("--overlap and --local-steps cannot be combined: choose one way to "
                              "hide communication.")
        self._check_prediction(algo)
        self._check_momentum_correction(algo)
        # option names and values; bounds that depend on the number of workers (softsync's n,
        # group's num_groups) are checked again once it is known, before any engine is used
        # (nbdist.job.coordinator_plan)
        make_rule(algo, 0, self.workers or MAX_WORKERS, self.rule_options())
        if algo in CUSTOM:  # a rule of the user's: the properties every built-in one has
            from nbdist.algorithms.custom import check_rule

            check_rule(CUSTOM[algo], self.rule_options())

    def _local_sgd_recipe(self) -> None:
        """The local-SGD recipes' own settings where the run leaves them: H = 500 inner steps
        per push (DiLoCo's; `--local-steps 1`, the flag's default, asks for them too; 100
        between two syncs of a fragment for streaming-diloco) and their outer optimizer:
        DiLoCo's Nesterov (`--server-optimizer nesterov`: momentum 0.9, rate 0.7);
        async-local-sgd's delayed Nesterov and streaming-diloco's per-fragment Nesterov are
        the rules themselves, on plain SGD. streaming-diloco's pushes hold one fragment, which
        only a codec without per-slice state encodes, and the simulator does not model them."""
        name = self.algorithm.value
        if self.mode.value not in modes_taking("local_steps"):
            raise ConfigError(
                f"--algorithm {name} trains rounds of local steps, which --mode "
                f"{self.mode.value} does not run. Use --mode async (or local, one worker; or "
                f"simulate).")
        streaming = self.algorithm is Algorithm.STREAMING_DILOCO
        if self.local_steps == 1:
            object.__setattr__(self, "local_steps",
                               STREAMING_INNER_STEPS if streaming else DILOCO_INNER_STEPS)
        if self.algorithm is Algorithm.DILOCO and self.server_optimizer is None:
            object.__setattr__(self, "server_optimizer", ServerOptimizer.NESTEROV)
        outer = self.server_optimizer
        if self.algorithm is not Algorithm.DILOCO and outer not in (None, ServerOptimizer.SGD):
            what = ("a Nesterov momentum on one fragment at a time" if streaming
                    else "a delayed Nesterov momentum on the workers' deltas")
            raise ConfigError(
                f"--algorithm {name} is its own outer optimizer, {what}, so it cannot step "
                f"through --server-optimizer {outer.value}. Drop --server-optimizer (its rate "
                "and momentum are the rule's options: --algo-opt outer_lr=0.7 --algo-opt "
                f"momentum=0.9), or use --algorithm diloco with --server-optimizer "
                f"{outer.value}.")
        if streaming and self.mode is Mode.SIMULATE:
            raise ConfigError(
                "--algorithm streaming-diloco is not simulated: the simulator's virtual workers "
                "exchange whole weights, not fragments. Use --algorithm diloco in --mode "
                "simulate, or train streaming-diloco in --mode async (or local).")
        if streaming and self.compression not in STREAMING_CODECS:
            raise ConfigError(
                f"--algorithm streaming-diloco sends one fragment per push, which --compression "
                f"{self.compression} cannot encode alone (it keeps state or a random stream "
                f"per whole slice). Use --compression {' or '.join(STREAMING_CODECS[1:])} for "
                "low-bit fragments, or leave --compression out.")
        if streaming and self.servers > 1:
            raise ConfigError(
                f"--algorithm streaming-diloco runs on one hub shard (Received: --servers "
                f"{self.servers}): a worker evaluates the whole model from one pull, which "
                "one shard sends. Drop --servers.")

    def _check_prediction(self, algo: str) -> None:
        if self.predict_weights not in (None, True, False):
            raise ConfigError(f"predict_weights must be True, False or None (automatic) "
                              f"(Received: {self.predict_weights!r}).")
        if self.predict_weights and not self._prediction_works:
            from nbdist.algorithms import rules_that  # NumPy: not at `import nbdist`

            modes = ", ".join(modes_taking("predict_weights"))
            rules = " or ".join(rules_that("predicts_weights"))
            raise ConfigError(
                f"--predict-weights works with --algorithm {rules}, one step per exchange, in the "
                f"modes {modes} (Received: --mode {self.mode.value}, --algorithm {algo}, "
                f"--local-steps {self.local_steps}). Drop --predict-weights, or pick one of those.")

    def _check_momentum_correction(self, algo: str) -> None:
        tail = self.average_tail
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, (int, float))
                                 or not 0 <= tail < 1):
            raise ConfigError(f"--average-tail expects the share of the run's samples whose "
                              f"updates are averaged, from 0 (off) up to but not including 1 "
                              f"(Received: {tail!r}). Example: --average-tail 0.1.")
        if self.precise_bn not in (None, True, False):
            raise ConfigError(f"precise_bn must be True, False or None (automatic) "
                              f"(Received: {self.precise_bn!r}).")
        if self.momentum_correction not in (None, True, False):
            raise ConfigError(f"momentum_correction must be True, False or None (automatic) "
                              f"(Received: {self.momentum_correction!r}).")
        if self.momentum_correction and not self.momentum_correction_works:
            from nbdist.algorithms import rules_that  # NumPy: not at `import nbdist`

            raise ConfigError(
                f"--momentum-correction works with --algorithm "
                f"{', '.join(rules_that('corrects_momentum'))}, one step per exchange, in the "
                f"modes {', '.join(modes_taking('momentum_correction'))}, where the hub's "
                f"optimizer takes each push as it lands (Received: --mode {self.mode.value}, "
                f"--algorithm {algo}, --local-steps {self.local_steps}). Drop "
                "--momentum-correction, or pick one of those.")

    def tail_fraction(self, num_workers: int) -> float:
        """The share of the run's samples over whose updates the weights handed back are
        averaged (`nbdist.core.tail_average`): --average-tail, or by default 0.1 where two or
        more workers' pushes each land on their own, late (`momentum_correction_works`: asgd,
        hogwild, ssp and the dc rules, one step per exchange). One worker is `fit`'s own
        sequence of updates, and `group`, `softsync` and local steps average pushes already:
        they hand back their last update, as `fit` does."""
        if self.mode.value not in modes_taking("average_tail"):
            return 0.0
        if self.average_tail is None:
            from nbdist.core.tail_average import TAIL_DEFAULT  # NumPy: not at `import nbdist`

            return TAIL_DEFAULT if num_workers > 1 and self.momentum_correction_works else 0.0
        return float(self.average_tail)

    @property
    def precise_bn_wanted(self) -> bool:
        """Whether BatchNorm statistics are to be recomputed at the run's weights (where the
        model has such layers and the data is in memory: `nbdist.job.Job.precise_bn`):
        --precise-bn, or by default in the modes that take it."""
        return self.precise_bn is not False and self.mode.value in modes_taking("precise_bn")

    @property
    def has_rule(self) -> bool:
        """Whether the mode's hub applies an update rule (--algorithm): not sync's, pipeline's."""
        return self.mode.value in modes_taking("algorithm")

    @property
    def rule(self) -> Algorithm | str:
        """The update rule the hub applies: --algorithm (a rule of the user's: its name), or
        asgd where it was left to nbdist (until the job picks one for the cell:
        `nbdist.job.Job.default_rule`)."""
        return self.algorithm or Algorithm.ASGD

    @property
    def rule_name(self) -> str:
        """The rule's name, as `nbdist.algorithms.rule_class` finds it."""
        return str(self.rule)

    @property
    def momentum_corrected(self) -> bool:
        """Whether the hub may lower the optimizer's momentum by the asynchrony's own:
        --momentum-correction, or by default wherever it works (a rule that
        `corrects_momentum`, one step per exchange, a mode with a rule); by default the job
        then keeps it for the optimizers it helps (`nbdist.job.Job.momentum_worth_correcting`)."""
        if self.momentum_correction is None:
            return self.momentum_correction_works
        return self.momentum_correction

    @property
    def momentum_correction_works(self) -> bool:
        """Whether the rule hands each push, as it lands, to the hub's optimizer (a rule that
        `corrects_momentum`, one step per exchange, a mode with a rule): where staleness acts."""
        from nbdist.algorithms import rule_class  # NumPy: not at `import nbdist`

        return (rule_class(self.rule_name).corrects_momentum and self.local_steps == 1
                and self.mode.value in modes_taking("momentum_correction"))

    @property
    def weights_predicted(self) -> bool:
        """Whether workers read predicted weights: --predict-weights, or by default wherever
        it works (a rule that `predicts_weights`, one step per exchange, a mode with a rule)."""
        return self._prediction_works if self.predict_weights is None else self.predict_weights

    @property
    def _prediction_works(self) -> bool:
        from nbdist.algorithms import rule_class  # NumPy: not at `import nbdist`

        return (rule_class(self.rule_name).predicts_weights and self.local_steps == 1
                and self.mode.value in modes_taking("predict_weights"))

    def _check_checkpoints(self) -> None:
        if self.checkpoint_dir is not None:
            if (not isinstance(self.checkpoint_dir, (str, os.PathLike))
                    or not os.fspath(self.checkpoint_dir)):
                raise ConfigError(f"--checkpoint-dir expects a folder path (Received: "
                                  f"{self.checkpoint_dir!r}).")
            object.__setattr__(self, "checkpoint_dir", os.fspath(self.checkpoint_dir))
        if self.checkpoint_every is not None:
            every = self.checkpoint_every
            if (isinstance(every, bool) or not isinstance(every, (int, float))
                    or not (math.isfinite(every) and every > 0)):
                raise ConfigError(f"--checkpoint-every must be a positive number of seconds "
                                  f"(Received: {every!r}). Example: --checkpoint-every 60.")
            if self.checkpoint_dir is None:
                raise ConfigError("--checkpoint-every needs --checkpoint-dir: say where the "
                                  "checkpoints go, e.g. --checkpoint-dir ckpt "
                                  "--checkpoint-every 60.")

    @property
    def lr_owner(self) -> str:
        """Who applies the learning rate: "workers" where each applies the cell's own
        optimizer (the mode's spec says so for sync ranks and pipeline stages; in the hub modes,
        --local-steps workers and a rule's whose workers step, easgd's), else "hub", the hub's
        optimizer."""
        from nbdist.algorithms import rule_class  # NumPy: not at `import nbdist`

        workers = (mode_spec(self.mode).lr_owner == "workers" or self.local_steps > 1
                   or rule_class(self.rule_name).workers_step)
        return "workers" if workers else "hub"

    @property
    def batchnorm_synced(self) -> bool:
        """Whether BatchNorm statistics are taken over the global batch (--mode sync only)."""
        return self.mode is Mode.SYNC and self.sync_batchnorm

    @property
    def checkpoint_interval(self) -> float | None:
        """Seconds between periodic checkpoints (None: no checkpoint folder, none taken)."""
        if self.checkpoint_dir is None:
            return None
        every = self.checkpoint_every
        return float(every) if every is not None else CHECKPOINT_EVERY_S

    def rule_options(self) -> dict:
        """The hub rule's hyper-parameters: --algo-opt plus the dedicated flags."""
        options = dict(self.algo_options)
        if self.rule is Algorithm.SSP and self.staleness is not None:
            options["staleness"] = self.staleness
        if self.rule is Algorithm.SOFTSYNC and self.n is not None:
            options["n"] = self.n
        if self.rule is Algorithm.GROUP and self.groups != "auto":
            options["num_groups"] = int(self.groups)
        return options

    def replace(self, **changes: object) -> TrainConfig:
        """A copy with some options changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain JSON-able dict (enums as strings), for engines and logs."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _algorithm(value: object) -> Algorithm | str:
    """--algorithm as the config keeps it: a built-in rule (`Algorithm`), or the name of a
    rule of the user's (a subclass of `nbdist.Rule`, given as the class, which is registered
    in this kernel, or by the name of one registered before)."""
    if isinstance(value, type):
        from nbdist.algorithms import RULES
        from nbdist.algorithms.custom import register, validate_class

        register(validate_class(value, set(RULES)))
        return value.name
    try:
        return _choice(Algorithm, value, "--algorithm")
    except ConfigError as exc:
        from nbdist.algorithms import CUSTOM

        if isinstance(value, str) and value in CUSTOM:
            return value
        raise ConfigError(
            f"{exc} Or name a rule of yours: a subclass of nbdist.Rule with that `name`, "
            "defined in the notebook before the run (pass the class to nbdist.train, or its "
            "name to %%distribute --algorithm).") from None


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _codec(value: object) -> str:
    """The `--compression` value in its canonical spelling (nbdist.core.compression)."""
    from nbdist.core.compression import parse  # NumPy: not at `import nbdist`

    try:
        return str(parse(getattr(value, "value", value)))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_int(flag: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(
            f"{flag} must be a whole number >= {low} (Received: {value!r}). "
            f"Pass e.g. {flag} {max(low, 1)}."
        )
