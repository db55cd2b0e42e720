"""`%nbdist` (cluster lifecycle) and `%%distribute` (train the cell): a thin shell over the API.

Their flags are declared once, in `nbdist.flags` (the training options as `TrainConfig` fields);
IPython's `magic_arguments` builds the parsers and the `%%distribute?` help from those
declarations. User text is parsed, never evaluated. Misuse (an unknown flag, a bad value, a
missing number of engines) raises IPython's `UsageError`: one line, no traceback. The magics
object holds this notebook's cluster and its latest run (no module-level state).
"""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from nbdist.cluster.engines import Cluster
from nbdist.errors import ConfigError, NoClusterError, UnsupportedOptimizerError
from nbdist.flags import distribute_flags, given_options, misplaced, nbdist_flags


def declared(flags):
    """`magic_arguments` from declarations: one `argument` per flag, in the order given."""
    def decorate(func):
        for flag in reversed(flags):  # IPython adds them to the parser in reverse
            names, kwargs = flag.parser_arguments()
            func = argument(*names, **kwargs)(func)
        return magic_arguments()(func)
    return decorate


@magics_class
class NbdistMagics(Magics):
    """The magics registered by `%load_ext nbdist`."""

    def __init__(self, shell):
        super().__init__(shell)
        self.cluster = None
        self.run = None

    @declared(nbdist_flags())
    @line_magic
    def nbdist(self, line: str) -> None:
        """Manage the engine cluster: %nbdist start 3 [--launcher slurm|mpi] | connect --profile lab
        --cluster-id ID | status | stop"""
        args = parse_argstring(self.nbdist, line)
        _check_applies(args)
        if args.action == "stop":
            stopped = self.cluster is not None or self.run is not None
            self.close()
            print("Stopped." if stopped else "No cluster or run to stop.")
            return
        if args.action == "status":
            print(self.cluster.describe() if self.cluster
                  else "No cluster. Start one with %nbdist start 3.")
            if self.run is not None:
                print(self.run.summary())
            return
        if self.cluster is not None:
            raise UsageError(f"A cluster is already up ({self.cluster.describe()}). Run %nbdist "
                             f"stop first, then %nbdist {args.action} again.")
        try:
            if args.action == "start":
                if not args.n or args.n < 1:
                    raise UsageError(f"%nbdist start needs a number of engines >= 1 "
                                     f"(Received: {args.n}). Example: %nbdist start 3 (one hub "
                                     "and two workers).")
                self.cluster = Cluster.start(args.n, profile=args.profile, encrypt=args.encrypt,
                                             launcher=args.launcher)
                print(f"Started {self.cluster.describe()}")
            else:
                self.cluster = Cluster.connect(profile=args.profile, cluster_id=args.cluster_id,
                                               encrypt=args.encrypt)
                print(f"Connected to {self.cluster.describe()}")
        except (ConfigError, NoClusterError) as exc:
            raise UsageError(" ".join(str(exc).split())) from None  # one line

    @declared(distribute_flags())
    @cell_magic
    def distribute(self, line: str, cell: str):
        """Train the model this cell builds, distributed: %%distribute --workers 2 --epochs 2"""
        args = parse_argstring(self.distribute, line)
        from nbdist.api import resume, train  # the run's modules (pandas): not at %load_ext

        if self.run is not None and not self.run.ended():
            raise UsageError(f"The previous run is still {self.run.status}. Call "
                             "run.stop() or run.wait() before starting another.")
        source = self.shell.transform_cell(cell)
        options = given_options(args)  # only the flags given: the rest keep TrainConfig's
        presenter = _MagicPresenter(self, args)  # defaults or, resuming, the checkpoint's values
        try:
            if args.resume is not None:
                resume(args.resume, source, cluster=self.cluster, namespace=self.shell.user_ns,
                       presenter=presenter, wait=args.wait, **options)
            else:
                train(source, cluster=self.cluster, namespace=self.shell.user_ns,
                      presenter=presenter, wait=args.wait, **options)
        except (ConfigError, NoClusterError) as exc:
            if isinstance(exc, UnsupportedOptimizerError):  # the cell's, not the flags'
                raise
            raise UsageError(str(exc)) from None

    def close(self) -> None:
        """Stop the latest run and the cluster we started (a connected one is only released)."""
        if self.run is not None:
            self.run.close(timeout=30)
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


def _check_applies(args) -> None:
    """Raise UsageError for an argument the `%nbdist` action does not take (it would be
    ignored), naming the ones it takes."""
    wrong = misplaced(args, nbdist_flags())
    if not wrong:
        return

    def name(flag) -> str:
        return flag.metavar or flag.spelling[-1]

    def received(flag) -> str:
        value = getattr(args, flag.name)
        return str(value) if flag.positional else name(flag) + ("" if flag.switch else f" {value}")

    takes = [name(f) for f in nbdist_flags() if f.actions is not None and args.action in f.actions]
    raise UsageError(f"%nbdist {args.action} takes no {', '.join(map(name, wrong))} (Received: "
                     f"{', '.join(map(received, wrong))}). It takes "
                     f"{', '.join(takes) or 'nothing more'}: drop the rest "
                     "(%nbdist? lists them).")


class _MagicPresenter:
    """Shows a run under the cell (binds `-o NAME`, the dashboard or the status line) and waits
    for it when the cell must (`--wait`, or a cell's own model.fit call)."""

    def __init__(self, magics: NbdistMagics, args):
        self.magics, self.args = magics, args
        # the live dashboard under the cell (None: the text status line, or none)
        self.dashboard = None

    @property
    def shows_dashboard(self) -> bool:
        return self.dashboard is not None

    def started(self, run) -> None:
        self.magics.run = run
        self.magics.shell.user_ns[self.args.output] = run
        if not self.args.no_dashboard:
            from nbdist.dashboard.widget import show  # pandas: not at %load_ext

            self.dashboard = show(run, top_k=self.args.top_k)

    def wait(self, run, on_tick) -> None:
        """Block until the run ends, the dashboard and its controls live meanwhile; raises the
        run's error if it failed."""
        from nbdist.run.live_wait import wait_live  # pandas: not at %load_ext

        wait_live(run, self.dashboard, on_tick=on_tick)
