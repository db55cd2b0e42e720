"""`--sim calibrate=1`: the simulator's cost model measured, not assumed.

Responsible for:
- timing the cell's real gradient step (the `FlatModel` call a worker makes) at three batch
  sizes (batch/4, batch, 4·batch) and fitting `T(b) = per_step + per_sample · b`
  (`nbdist.core.simclock.fit_cost`);
- timing one worker's push+pull round trip through a real hub for the model's size (a hub
  thread and a `WorkerTransport` over TCP loopback, signed frames as in a run, with the run's
  `--compression`), and the hub's own CPU time per push in it (`nbdist.hub.profile`: every
  phase but the receive, which also waits, and the loop's idle turns);
- doing both on engine 0 of the cluster the run was given (the model travels as its Keras JSON
  and weights), or in this kernel when there is none. `Calibration.where` says which.

The simulator's step time is then `slowdown · (per_step + per_sample · b)` with `per_step` the
fitted fixed cost plus the worker's side of the round trip, and the hub's side is `per_push`,
which the hub spends on each push one at a time (so many workers queue at it): without
--overlap a worker waits for its push and pull before the next step. The numbers are rounded
to two digits, so passing them back with `--sim per_step=...,per_sample=...,per_push=...`
repeats a calibrated run exactly.
"""

from __future__ import annotations

import socket
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np

from nbdist.core.coordinator import Plan
from nbdist.core.simclock import CostModel, fit_cost, round2
from nbdist.engine.data import num_rows, take
from nbdist.engine.flat_layout import ensure_built, read_flat
from nbdist.engine.flatmodel import FlatModel
from nbdist.hub.client import WorkerTransport
from nbdist.hub.control import HubControl
from nbdist.hub.launch import join_hub, start_hub
from nbdist.hub.profile import PHASES
from nbdist.hub.protocol import new_key
from nbdist.hub.server import HubSpec
from nbdist.wire.messages import Step

REPEATS = 10  # at least this many timed calls per batch size, and at least MIN_TIMED_S of them;
MIN_TIMED_S = 0.3  # the fastest is kept: on a busy machine the others include waiting for a
                   # core (a median measured under load doubled the fixed cost), the fastest is
                   # the step's own cost, which is what the simulated cluster's nodes pay
ROUND_TRIPS = 20


@dataclass(frozen=True)
class Calibration:
    """What a calibration measured, and the cost model the simulation uses from it."""

    cost: CostModel
    compute_per_step_s: float  # fitted fixed cost of one gradient step (call, assignment)
    per_sample_s: float
    hub_round_trip_s: float  # one push+pull of the whole parameter vector, the fastest
    hub_per_push_s: float = 0.0  # the hub's CPU time per push in that round trip
    points: list = field(default_factory=list)  # (batch, fastest seconds) as measured
    where: str = "kernel"  # "kernel", or "engine N (host)" when a cluster was given

    def as_event(self) -> dict:
        """The fields `run.events` shows (kind "sim_calibration")."""
        out = asdict(self)
        out.pop("cost")
        out.update(per_step_s=self.cost.per_step_s, per_push_s=self.hub_per_push_s,
                   points=[list(p) for p in self.points])
        return out


def describe(found: Calibration) -> str:
    """One line for the run's notes: the fit, its parts, and how to repeat it exactly."""
    c, hub = found.cost, found.hub_per_push_s
    return (f"--sim calibrate measured on the {found.where}: per step {c.per_step_s * 1e3:.3g} ms "
            f"(compute {found.compute_per_step_s * 1e3:.3g} ms + the worker's side of the hub "
            f"round trip {(found.hub_round_trip_s - hub) * 1e3:.3g} ms), "
            f"per sample {c.per_sample_s * 1e6:.3g} us, the hub's work per push "
            f"{hub * 1e3:.3g} ms. Repeat exactly with --sim per_step={c.per_step_s!r},"
            f"per_sample={c.per_sample_s!r},per_push={hub!r}")


def step_points(flat, params: np.ndarray, non_trainable: np.ndarray, x, y, batch: int,
                repeats: int = REPEATS) -> list[tuple[int, float]]:
    """Fastest seconds of the real gradient step at batch/4, batch and 4·batch (each traced once
    first; the data is tiled when it holds fewer samples than the largest batch)."""
    points = []
    for b in sorted({max(1, batch // 4), batch, 4 * batch}):
        index = np.arange(b) % num_rows(x)
        xb, yb = take(x, index), take(y, index)
        flat.assign_and_gradients(params, non_trainable, xb, yb)  # trace and warm
        times: list[float] = []
        while len(times) < repeats or (sum(times) < MIN_TIMED_S and len(times) < 50 * repeats):
            t0 = time.perf_counter()
            flat.assign_and_gradients(params, non_trainable, xb, yb)
            times.append(time.perf_counter() - t0)
        points.append((b, float(min(times))))
    return points


def hub_round_trip(size: int, trips: int = ROUND_TRIPS) -> float:
    """Fastest seconds of one push+pull of `size` floats through a real hub (TCP loopback)."""
    return hub_costs(size, trips=trips)[0]


def hub_costs(size: int, compression: str = "none", trips: int = ROUND_TRIPS,
              seed: int = 0) -> tuple[float, float]:
    """`(round trip, hub)`: the fastest seconds of one push+pull of a `size`-float gradient (random
    normal, so a codec's frames have their usual size) through a real hub over TCP loopback
    with `compression`, and the hub's mean CPU seconds per push (its profile's phases but the
    receive and the idle loop)."""
    key, run_id = new_key(), f"calib-{uuid.uuid4().hex[:8]}"
    plan = Plan(num_workers=1, num_samples=10**12, epochs=1, batch_size=32, lr=0.0,
                has_validation=False)
    spec = HubSpec(run_id=run_id, key=key, shard=0, num_shards=1, plan=plan,
                   params=np.zeros(size, np.float32), non_trainable=np.zeros(0, np.float32),
                   optimizer=None, idle_timeout=30.0, profile=True)  # plain SGD at rate 0
    endpoints = [start_hub(spec)]
    worker = control = None
    summary: dict = {}
    gradient = np.random.default_rng(seed).standard_normal(size).astype(np.float32)
    try:
        worker = WorkerTransport(key, 0, endpoints, 0, "tcp", timeout=30.0,
                                 compression=compression)
        reply, started, times = worker.hello(), set(), []
        for i in range(trips + 3):  # the first three warm the sockets
            chunks = [c for c in reply.chunks if c.id not in started]
            if not chunks:
                reply = worker.step(Step(0, pull=True))
                continue
            started.add(chunks[0].id)
            np.copyto(worker.grad, gradient)
            t0 = time.perf_counter()
            reply = worker.step(Step(0, push=True, pull=True, chunks=[chunks[0].id], loss=0.0))
            if i >= 3:
                times.append(time.perf_counter() - t0)
        worker.bye()
    finally:
        if worker is not None:
            worker.close()
        control = HubControl(key, endpoints, timeout=10.0)
        try:
            control.shutdown()
        finally:
            control.close()
        summary = join_hub(run_id, 0, timeout=10.0)
    phases = summary.get("profile") or {}
    # per push: the receive also waits, and the loop's idle turns are no push's work
    hub_s = sum(phases.get(p, 0.0) for p in PHASES if p not in ("recv", "loop")) / 1e6
    return float(min(times)), min(hub_s, float(min(times)))


def measure(flat, params, non_trainable, x, y, batch: int, compression: str = "none") -> dict:
    """Both measurements, where this runs (the kernel or an engine)."""
    round_trip, hub = hub_costs(int(params.size), compression)
    return {"points": step_points(flat, params, non_trainable, x, y, batch),
            "round_trip": round_trip, "hub": hub, "host": socket.gethostname()}


def measure_on_engine(model_json: str, weights: list, loss, x, y, batch: int,
                      compression: str = "none") -> dict:
    """Engine side: rebuild the cell's model from its JSON and weights, then `measure`."""
    import keras  # Keras: after the cell picks its backend

    model = keras.models.model_from_json(model_json)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss)
    ensure_built(model, take(x, slice(0, 2)))
    model.set_weights(weights)
    params, non_trainable = read_flat(model)
    return measure(FlatModel(model), params, non_trainable, x, y, batch, compression)


def calibrate(flat, params: np.ndarray, non_trainable: np.ndarray, x, y, batch: int,
              jitter: float = 0.0, cluster=None, compression: str = "none") -> Calibration:
    """Measure on engine 0 of `cluster` (or here when None) and fit the simulation's cost model."""
    sample = slice(0, min(num_rows(x), 4 * batch))
    if cluster is None:
        measured, where = (measure(flat, params, non_trainable, x[sample], y[sample], batch,
                                   compression), "kernel")
    else:
        model = flat.model
        engine = sorted(cluster.client.ids)[0]
        measured = cluster.client[engine].apply_sync(
            measure_on_engine, model.to_json(), model.get_weights(), model.loss, x[sample],
            y[sample], batch, compression)
        where = f"engine {engine} ({measured['host']})"
    fitted = fit_cost(measured["points"])
    rtt, hub = measured["round_trip"], round2(measured["hub"])
    cost = CostModel(round2(fitted.per_step_s + rtt - hub), fitted.per_sample_s, jitter)
    return Calibration(cost, fitted.per_step_s, fitted.per_sample_s, round2(rtt), hub,
                       measured["points"], where)
