"""What a Run shows: its history, nodes, timeline, delays and events as DataFrames, its
one-line summary, its report and its dashboard. Read-only views of what the monitor thread
(`nbdist.run.monitor`) fetched into the run's state (`nbdist.run.state`); the `Run` handle
(`nbdist.run.handle`) has these methods."""

from __future__ import annotations

import pandas as pd

from nbdist.core.stats import HISTORY_COLUMNS
from nbdist.dashboard.comparison import compare as compare_runs
from nbdist.dashboard.comparison import comparison_figures, named_runs
from nbdist.dashboard.report import write_report
from nbdist.dashboard.widget import Dashboard
from nbdist.run.state import RunState

NODE_COLUMNS = ["worker", "engine", "host", "state", "samples", "samples_per_s", "steps",
                "delay_mean", "delay_p95", "delay_max", "batch_size", "slowdown", "group", "loss",
                "compute_s", "comm_s", "link", "bytes_sent", "bytes_received", "tcp_bytes",
                "shm_bytes", "bytes_per_s", "compression", "frame_bytes", "float32_bytes",
                "compression_ratio", "gpu", "gpu_util", "gpu_mem", "gpu_mem_total"]
TRAFFIC_COLUMNS = ["worker", "host", "link", "compression", "bytes_sent", "bytes_received",
                   "bytes_per_s", "frame_bytes", "float32_bytes", "compression_ratio"]


class RunViews:
    """The result views of a `Run` (see `nbdist.run.handle`), over its `state`."""

    state: RunState

    # -- results ----------------------------------------------------------------------------

    @property
    def history(self) -> pd.DataFrame:
        """One row per applied push (time, step, epoch, worker, loss, delay, batch_size),
        plus one row per validation result (`val_*` columns)."""
        train = pd.DataFrame(self.state.rows, columns=list(HISTORY_COLUMNS))
        evals = pd.DataFrame(self.state.snapshot.get("evals", []))
        if evals.empty:
            return train
        evals = evals.drop(columns=["version"], errors="ignore")
        return (pd.concat([train, evals], ignore_index=True)
                .sort_values(["step", "time"], kind="stable").reset_index(drop=True))

    @property
    def nodes(self) -> pd.DataFrame:
        """One row per worker: state, samples, samples/s, steps, delay, batch size, ..., its
        link to the hub ("tcp" or "shm"), the bytes that crossed its sockets (sent, received;
        over TCP and over the shared-memory link's sockets, which carry headers only), its
        traffic in bytes/s, and its GPU (name, utilisation %, memory used and total, in bytes;
        empty without one)."""
        return pd.DataFrame(self.state.snapshot.get("nodes", []), columns=NODE_COLUMNS)

    @property
    def traffic(self) -> pd.DataFrame:
        """One row per worker: the bytes on its sockets (sent, received, and per second now),
        its `--compression` codec (over TCP; "none" on shared memory), the bytes of its weight
        and gradient frames and of the float32 arrays they stand for, and their ratio."""
        return self.nodes[TRAFFIC_COLUMNS]

    @property
    def timeline(self) -> pd.DataFrame:
        """Per-worker time series (samples/s, compute, comm, wait, batch, delay, loss,
        slow-down, group), down-sampled on the hub so long runs stay bounded."""
        return pd.DataFrame(self.state.timeline)

    @property
    def delays(self) -> pd.DataFrame:
        """How often each delay (staleness, in versions) occurred, per worker."""
        delays = self.state.snapshot.get("delays", {})
        rows = [{"worker": int(w), "delay": int(d), "count": c}
                for w, hist in delays.items() for d, c in hist.items()]
        return pd.DataFrame(rows, columns=["worker", "delay", "count"])

    @property
    def events(self) -> pd.DataFrame:
        """What nbdist chose before the start (e.g. which model), then control actions and
        epoch ends, with time and global step."""
        return pd.DataFrame(self.state.notes + self.state.snapshot.get("events", [])
                            + self.state.recoveries)

    @property
    def lr(self) -> float | None:
        """The learning rate now: a schedule's value at the hub's step, or a set_lr override."""
        return self.state.snapshot.get("lr")

    @property
    def stats(self) -> dict:
        """The hub's latest statistics as the kernel last polled them (a copy): global_step,
        epochs_done, epoch_samples, lr, batch_policy, rule_options, hub_bytes, dropped, ..."""
        return dict(self.state.snapshot)

    @property
    def worker_results(self) -> dict[int, object]:
        """What each worker returned once it has ended, by worker id (sync: by rank, with its
        steps, learning rate and final parameters; async: its steps and the passes over its
        data shard; pipeline: by stage); {} before, and in --mode simulate."""
        backend = self.state.backend
        return {} if backend is None else backend.worker_results()

    def history_rows(self, since: int = 0) -> list[list]:
        """The raw per-push rows (`HISTORY_COLUMNS` order) from index `since` on: what the
        DataFrame `history` is built from, without building it."""
        return self.state.rows[since:]

    def note(self, text: str) -> None:
        """Record a choice nbdist made for this run before it started (time 0, step 0)."""
        self.state.notes.append({"time": 0.0, "step": 0, "event": "note", "text": text})

    def report(self, path: str = "nbdist-report.html", top_k: int | None = None,
               compare: list | None = None):
        """Write one self-contained HTML file (plotly.js inline, viewable offline) with every
        dashboard figure and the node table; with `compare=[other, ...]` also this run and
        the others side by side (see `compare`). Returns its path.

        Example:
            >>> run.wait().report("out/run.html", compare=[other_run])   # doctest: +SKIP
        """
        extra = comparison_figures(named_runs((self, *compare), None)) if compare else None
        return write_report(path, history=self.history, nodes=self.nodes, timeline=self.timeline,
                            delays=self.delays, events=self.events,
                            title=f"nbdist run {self.state.run_id}",
                            summary=self.summary(), top_k=top_k, extra=extra,
                            hubs=self.state.hubs)

    def compare(self, *others, metric: str = "accuracy", x: str = "time", **kwargs):
        """This run and `others` (Runs) on the same axes: `nbdist.compare(self, *others, ...)`.

        Example:
            >>> asgd_run.compare(dc_run, metric="loss", x="samples")   # doctest: +SKIP
        """
        return compare_runs(self, *others, metric=metric, x=x, **kwargs)

    def dashboard(self, top_k: int | None = None):
        """The live dashboard (plots and controls) of this run, for display in a notebook;
        `%%distribute` shows one itself unless `--no-dashboard`.

        Example:
            >>> run = nbdist.train(cell, cluster=cluster, epochs=5)   # doctest: +SKIP
            >>> run.dashboard(top_k=4)                                # doctest: +SKIP
        """
        return Dashboard(self, top_k=top_k)

    # -- display ----------------------------------------------------------------------------

    def summary(self) -> str:
        """One line: status, progress, step, loss, validation accuracy."""
        state = self.state
        s = state.snapshot
        parts = [f"nbdist run {state.run_id}: {state.status}",
                 f"epoch {s.get('epochs_done', 0):.2f}/{state.config.epochs}",
                 f"step {s.get('global_step', 0)}"]
        if state.rows:
            parts.append(f"loss {state.rows[-1][4]:.4f}")
        evals = s.get("evals") or []
        if evals:
            last = evals[-1]
            parts += [f"{k} {v:.4f}" for k, v in last.items() if k.startswith("val_")]
        if state.warnings:
            parts.append(f"{len(state.warnings)} warning(s): {state.warnings[-1]}")
        if state.error is not None:
            parts.append(f"error: {str(state.error).splitlines()[0]}")
        return " | ".join(parts)

    def __repr__(self) -> str:
        return f"<Run {self.summary()}>"

