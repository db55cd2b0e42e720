"""`%nbdist` (cluster lifecycle) and `%%distribute` (train the cell): a thin shell over the API.

Flags are declared with IPython's `magic_arguments` and handed to `nbdist.train` unchanged;
user text is parsed, never evaluated. The magics object holds this notebook's cluster and
its latest run (no module-level state).
"""

from __future__ import annotations

import argparse

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from nbdist.config import Algorithm, Compression, Metrics, Mode, ServerOptimizer, Transport
from nbdist.errors import ClusterError, ConfigError, NoClusterError


@magics_class
class NbdistMagics(Magics):
    """The magics registered by `%load_ext nbdist`."""

    def __init__(self, shell):
        super().__init__(shell)
        self.cluster = None
        self.run = None

    @magic_arguments()
    @argument("action", choices=["start", "connect", "status", "stop"],
              help="start N local engines, connect to a running ipcluster, show status, or stop")
    @argument("n", nargs="?", type=int, default=None, help="number of engines (start)")
    @argument("--profile", default=None, help="ipyparallel profile (e.g. one set up for Slurm)")
    @argument("--cluster-id", default=None, help="cluster id of a running ipcluster (connect)")
    @argument("--encrypt", action="store_true",
              help="CurveZMQ on ipyparallel's channel and nbdist's hub sockets (untrusted networks)")
    @argument("--launcher", default="local", choices=["local", "slurm", "mpi"],
              help="start: how engines are started (ipyparallel's launchers): local processes, "
                   "one Slurm job (sbatch), or MPI ranks (mpiexec)")
    @line_magic
    def nbdist(self, line: str) -> None:
        """Manage the engine cluster: %nbdist start 3 [--launcher slurm|mpi] | connect --profile lab
        --cluster-id ID | status | stop"""
        args = parse_argstring(self.nbdist, line)
        from nbdist.cluster.engines import Cluster

        if args.action == "start":
            if self.cluster is not None:
                raise ClusterError(f"A cluster is already up ({self.cluster.describe()}). "
                                   "Run %nbdist stop first to start a different one.")
            if not args.n or args.n < 1:
                raise ClusterError(f"%nbdist start needs a number of engines >= 1 (Received: {args.n}). "
                                   "Example: %nbdist start 3 (one hub and two workers).")
            self.cluster = Cluster.start(args.n, profile=args.profile, encrypt=args.encrypt,
                                         launcher=args.launcher)
            print(f"Started {self.cluster.describe()}")
        elif args.action == "connect":
            if self.cluster is not None:
                raise ClusterError("Already attached to a cluster. Run %nbdist stop first.")
            self.cluster = Cluster.connect(profile=args.profile, cluster_id=args.cluster_id,
                                           encrypt=args.encrypt)
            print(f"Connected to {self.cluster.describe()}")
        elif args.action == "status":
            print(self.cluster.describe() if self.cluster else "No cluster. Start one with %nbdist start 3.")
            if self.run is not None:
                print(self.run.summary())
        else:
            self.close()
            print("Stopped.")

    @magic_arguments()
    @argument("--mode", default=None, choices=[m.value for m in Mode],
              help="async: nbdist's parameter server; sync: Horovod allreduce; local: in this kernel; "
                   "simulate: virtual workers on a virtual clock, in this kernel")
    @argument("--algorithm", default=None, choices=[a.value for a in Algorithm],
              help="update rule on the hub")
    @argument("--workers", type=int, default=None, help="number of workers (default: all free engines)")
    @argument("--servers", type=int, default=None, help="number of parameter shards (hub engines; default 1)")
    @argument("--epochs", type=int, default=None, help="passes over the data (default 1)")
    @argument("--batch-size", type=int, default=None, help="samples per worker step (default 32)")
    @argument("--lr", type=float, default=None, help="learning rate (default: the cell's optimizer's)")
    @argument("--model", default=None, help="variable holding the model (default: the one the cell defines)")
    @argument("--data", default=None,
              help="training arrays X,Y (default x_train,y_train), or one tf.data.Dataset or "
                   "generator function NAME")
    @argument("--validation", default=None,
              help="validation arrays X,Y or one dataset NAME (default: x_test,y_test if defined)")
    @argument("--in-memory-limit", default=None,
              help="a dataset larger than this (decoded; default 2GiB) is streamed by shards, e.g. 500MB")
    @argument("--no-validation", action="store_true", default=None, help="skip validation")
    @argument("--seed", type=int, default=None, help="seed of the epoch permutations (default 0)")
    @argument("--transport", default=None, choices=[t.value for t in Transport])
    @argument("--compression", default=None, choices=[c.value for c in Compression],
              help="fp16: parameters and gradients cross the network as float16 (half the bytes); "
                   "the hub keeps float32")
    @argument("--timeout", type=float, default=None, help="seconds of silence before a run fails (default 120)")
    @argument("--algo-opt", default=None, help="rule hyper-parameters, e.g. lambda0=2,momentum=0.9")
    @argument("--staleness-lr", action="store_true", default=None, help="divide the rate by the push's delay")
    @argument("--staleness", type=int, default=None, help="ssp: clocks a worker may run ahead")
    @argument("--n", type=int, default=None, help="softsync: apply the mean of every M//n pushes")
    @argument("--groups", default=None, help="group: 'auto' (from speeds, the default) or a number of groups")
    @argument("--local-steps", type=int, default=None, help="steps with the cell's optimizer per exchange (default 1)")
    @argument("--server-optimizer", default=None, choices=[o.value for o in ServerOptimizer],
              help="the hub's optimizer instead of the cell's (default: the cell's; with "
                   "--local-steps, SGD at rate 1 on the deltas)")
    @argument("--overlap", action="store_true", default=None, help="push step t while computing step t+1")
    @argument("--pin", default=None, choices=["auto", "off"],
              help="auto: one core per hub shard, the rest split between the workers on each host")
    @argument("--spin", default=None, choices=["auto", "off"],
              help="auto (default): a hub shard with a core of its own, and its workers on the same "
                   "host, poll for messages instead of sleeping; off: they sleep")
    @argument("--dbs", action="store_true", default=None, help="batch sizes in proportion to measured speed")
    @argument("--batch-min", type=int, default=None, help="DBS floor (default: batch-size // 4)")
    @argument("--batch-max", type=int, default=None, help="DBS ceiling (default: workers x batch-size)")
    @argument("--slowdown", default=None, help="per-worker slow-down factors, e.g. 1,2,4")
    @argument("--metrics", default=None, choices=[m.value for m in Metrics])
    @argument("--elastic", action="store_true", default=None,
              help="async: engines that join the cluster while the run trains become workers")
    @argument("--checkpoint-dir", default=None, help="folder for checkpoints of the hub's state")
    @argument("--checkpoint-every", type=float, default=None,
              help="seconds between checkpoints (default 60 with --checkpoint-dir)")
    @argument("--resume", default=None,
              help="continue from this checkpoint; flags given here override the saved ones")
    @argument("--sim", default=None,
              help="--mode simulate: per_step=1e-3,per_sample=2e-5,jitter=0,calibrate=0,eval_every=0,sync=0")
    @argument("--sync-batchnorm", action=argparse.BooleanOptionalAction, default=None,
              help="--mode sync: BatchNorm statistics over the global batch (default: off)")
    @argument("--stages", type=int, default=None, help="--mode pipeline: stages, one engine each (default 2)")
    @argument("--micro-batches", type=int, default=None,
              help="--mode pipeline: micro-batches per mini-batch (default 4; must divide --batch-size)")
    @argument("--partition", default=None, choices=["optimal", "greedy", "uniform", "random"],
              help="--mode pipeline: how layers are cut into stages, from their measured costs (default optimal)")
    @argument("--schedule", default=None, choices=["gpipe", "1f1b"],
              help="--mode pipeline: all forwards then all backwards (gpipe, default), or 1f1b")
    @argument("--wait", action="store_true", help="block until training ends")
    @argument("--no-dashboard", action="store_true", help="do not show the live dashboard")
    @argument("--top-k", type=int, default=None,
              help="dashboard: draw only the k slowest workers and the mean of the others")
    @argument("-o", "--output", default="_nbdist_run", help="variable that receives the Run")
    @cell_magic
    def distribute(self, line: str, cell: str):
        """Train the model this cell builds, distributed: %%distribute --workers 2 --epochs 2"""
        args = parse_argstring(self.distribute, line)
        from nbdist.api import resume, train

        if self.run is not None and not self.run.done:
            raise ClusterError(f"The previous run is still {self.run.status}. Call "
                               "run.stop() or run.wait() before starting another.")
        if args.resume is None and args.mode in (None, Mode.ASYNC.value) and self.cluster is None:
            raise NoClusterError("No cluster. Start one first with %nbdist start 3 "
                                 "(or %nbdist connect --profile P), or use --mode local.")
        source = self.shell.transform_cell(cell)
        options = _options(args)  # only the flags given: the rest keep TrainConfig's defaults,
        if args.resume is not None:  # or, resuming, the checkpoint's values
            run = resume(args.resume, source, cluster=self.cluster, namespace=self.shell.user_ns, **options)
        else:
            run = train(source, cluster=self.cluster, namespace=self.shell.user_ns, **options)
        self.run = run
        self.shell.user_ns[args.output] = run
        dashboard = None
        if not args.no_dashboard:
            from nbdist.dashboard.widget import show

            dashboard = show(run, top_k=args.top_k)
        if args.wait:  # the dashboard and its controls stay live while the cell waits
            from nbdist.dashboard.live_wait import wait_live

            wait_live(run, dashboard)

    def close(self) -> None:
        """Stop the latest run and the cluster we started (a connected one is only released)."""
        if self.run is not None:
            self.run.close(timeout=30)
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


def _options(args) -> dict:
    """The flags that were given, as `nbdist.train` options (a flag not given is None here,
    so TrainConfig alone owns the defaults, and a resume keeps the checkpoint's values)."""
    options = dict(
        mode=args.mode, algorithm=args.algorithm, workers=args.workers, servers=args.servers,
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, model=args.model, data=args.data,
        validation=args.validation, no_validation=args.no_validation, seed=args.seed,
        in_memory_limit=args.in_memory_limit, transport=args.transport, compression=args.compression,
        timeout=args.timeout, algo_options=args.algo_opt, staleness_lr=args.staleness_lr,
        staleness=args.staleness, n=args.n,
        groups=args.groups if args.groups in (None, "auto") else _int(args.groups, "--groups"),
        local_steps=args.local_steps, server_optimizer=args.server_optimizer, overlap=args.overlap,
        pin=args.pin, spin=args.spin, dbs=args.dbs, batch_min=args.batch_min, batch_max=args.batch_max, slowdown=args.slowdown,
        metrics=args.metrics, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        sim=args.sim, sync_batchnorm=args.sync_batchnorm, elastic=args.elastic, stages=args.stages,
        micro_batches=args.micro_batches, partition=args.partition, schedule=args.schedule)
    return {name: value for name, value in options.items() if value is not None}


def _int(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{flag} expects 'auto' or a whole number (Received: {text!r}).") from None
