"""Helpers shared by the training benchmarks (dbs_effect.py, sync_vs_async.py,
metrics_overhead.py): the model cell, running for a wall-clock budget, steady-state rates.

Import `_common` first (it quiets TensorFlow and puts the checkout on sys.path).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd

# The 784-256-256-10 MLP (SGD 0.05) on Fashion-MNIST, with the test split as validation data.
CELL = '''
import keras
from nbdist.datasets import load_fashion_mnist
(x_train, y_train), (x_test, y_test) = load_fashion_mnist()
x_train = x_train.reshape(-1, 784).astype("float32") / 255.0
x_test = x_test.reshape(-1, 784).astype("float32") / 255.0
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
'''
NUM_SAMPLES = 60000
# "Epochs large": runs end by run.stop() after their budget. Not larger: the hub's per-push
# bookkeeping with metrics="full" grows with the configured epochs (EpochSchedule.epochs_done
# sums over every epoch on each push), which would inflate the hub's cost per push.
FOREVER_EPOCHS = 50


class Sampler:
    """Records (kernel monotonic time, samples and steps per worker) at every hub poll the Run
    makes (about every 0.25 s), through the Run's listener hook, so rates need no history rows
    (they work with metrics="minimal" too)."""

    def __init__(self, run):
        self.points: list[tuple[float, list[int], list[int]]] = []
        self.first_push: float | None = None
        self._lock = threading.Lock()
        self._seen_first = threading.Event()
        run.state.listeners.append(self._on_poll)  # the Run's own poll hook
        self._on_poll(run)

    def _on_poll(self, run) -> None:
        nodes = run.state.snapshot.get("nodes", [])  # cheaper than building a DataFrame
        if not nodes:
            return
        now = time.monotonic()
        samples = [int(n["samples"]) for n in nodes]
        steps = [int(n["steps"]) for n in nodes]
        with self._lock:
            self.points.append((now, samples, steps))
            if self.first_push is None and sum(steps) > 0:
                self.first_push = now
                self._seen_first.set()

    def wait_first_push(self, run, timeout: float = 300.0) -> float:
        """Block until the first push was counted; returns its (kernel) time."""
        deadline = time.monotonic() + timeout
        while not self._seen_first.wait(0.05):
            if run.done() or time.monotonic() > deadline:
                run.wait(0)  # raises the run's error if it failed
                raise RuntimeError("the run ended or stalled before its first push")
        return self.first_push

    def rate(self, t0: float, t1: float) -> float:
        """Samples/s of all workers together between the first poll at or after t0 and the
        last poll at or before t1."""
        with self._lock:
            pts = [p for p in self.points if t0 <= p[0] <= t1]
        if len(pts) < 2:
            return float("nan")
        (ta, sa, _), (tb, sb, _) = pts[0], pts[-1]
        return (sum(sb) - sum(sa)) / (tb - ta)

    def worker_rates(self, t0: float, t1: float) -> list[float]:
        """Samples/s of each worker over the same polls as `rate`."""
        with self._lock:
            pts = [p for p in self.points if t0 <= p[0] <= t1]
        if len(pts) < 2:
            return []
        (ta, sa, _), (tb, sb, _) = pts[0], pts[-1]
        return [(b - a) / (tb - ta) for a, b in zip(sa, sb, strict=True)]

    def worker_step_times(self, t0: float, t1: float) -> list[float]:
        """Each worker's wall time per push (s) over the same polls as `rate`."""
        with self._lock:
            pts = [p for p in self.points if t0 <= p[0] <= t1]
        if len(pts) < 2:
            return []
        (ta, _, sa), (tb, _, sb) = pts[0], pts[-1]
        return [(tb - ta) / (b - a) if b > a else float("nan") for a, b in zip(sa, sb, strict=True)]


def run_for(run, seconds: float, warm: float = 0.0) -> dict:
    """Let `run` train `warm + seconds` after its first push, then stop it and wait.

    Returns kernel times {first_push, window: (t0, t1)} and the Sampler, for rates."""
    sampler = Sampler(run)
    with run:  # an error or Ctrl-C stops the run on the way out
        first = sampler.wait_first_push(run)
        time.sleep(warm + seconds)
        t_stop = time.monotonic()
        if run.done():
            raise RuntimeError(f"the run ended before its {warm + seconds:g} s budget; "
                               "raise FOREVER_EPOCHS in benchmarks/_training.py")
        run.stop()
        run.wait(120)
    return {"first_push": first, "window": (first + warm, t_stop), "sampler": sampler}


def pushes(run) -> pd.DataFrame:
    """run.history without the val_* rows (one row per applied push)."""
    h = run.history
    if "val_loss" in h.columns:
        h = h[h["val_loss"].isna()]
    return h.dropna(subset=["worker"])


def history_window(hist: pd.DataFrame, start_frac: float, stop_time: float | None = None,
                   end_frac: float = 1.0) -> tuple[pd.DataFrame, float, float]:
    """The pushes inside [t_first + start_frac * span, t_first + end_frac * span] (hub time),
    span ending at `stop_time` (e.g. the stop event) or at the last push."""
    t_first = float(hist["time"].min())
    t_last = float(stop_time if stop_time is not None else hist["time"].max())
    span = t_last - t_first
    t0, t1 = t_first + start_frac * span, t_first + end_frac * span
    return hist[(hist["time"] > t0) & (hist["time"] <= t1)], t0, t1


def stop_time(run) -> float | None:
    """Hub time of the run's stop event, if it was stopped."""
    ev = run.events
    if ev.empty or "event" not in ev.columns:
        return None
    stops = ev[ev["event"] == "stop"]
    return float(stops["time"].iloc[0]) if len(stops) else None


def last_val(run) -> dict:
    """The last val_* row of run.history ({} if none)."""
    h = run.history
    if "val_loss" not in h.columns:
        return {}
    v = h.dropna(subset=["val_loss"])
    return {} if v.empty else v.iloc[-1].to_dict()


def evaluate_kernel_model(ns: dict) -> tuple[float, float]:
    """(test loss, test accuracy) of the kernel's model after the run (it holds the trained
    weights), on the cell's x_test/y_test."""
    result = ns["model"].evaluate(ns["x_test"], ns["y_test"], batch_size=1000, verbose=0,
                                  return_dict=True)
    return float(result["loss"]), float(result.get("accuracy", float("nan")))


def percentile(values, q: float) -> float:
    values = np.asarray(values, dtype=float)
    return float(np.percentile(values, q)) if values.size else float("nan")
