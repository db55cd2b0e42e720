"""Hub shards and one worker as threads in this kernel (`--mode local`)."""

from __future__ import annotations

import threading
from dataclasses import replace

from nbdist.errors import ConfigError, TrainingError
from nbdist.hub.server import HubSpec
from nbdist.modes.common.hub_weights import HubShardWeights
from nbdist.modes.common.kernel_hub import KernelHubs
from nbdist.modes.common.worker import WorkerSpec, run_worker
from nbdist.run.backend import Backend


class LocalBackend(HubShardWeights, Backend):
    """Hub shards and one worker as threads in this kernel; the worker uses the kernel's own
    namespace, so the cell is not run a second time."""

    num_workers = 1
    cluster = None  # nothing outside this kernel

    def __init__(self, namespace: dict):
        self.namespace = namespace
        self._hubs = KernelHubs()
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None
        self._result: dict | None = None  # what the worker returned

    def start_hubs(self, specs: list[HubSpec]) -> list[dict]:
        return self._hubs.start(specs)

    def start_workers(self, base: WorkerSpec) -> None:
        def work() -> None:
            try:
                self._result = run_worker(replace(base, worker=0, source=None),
                                          namespace=self.namespace)
            except BaseException as exc:  # noqa: BLE001 - reported by failure()
                self._error = exc

        self._worker = threading.Thread(target=work, daemon=True, name="nbdist-local-worker")
        self._worker.start()

    def hub_places(self, endpoints: list[dict]) -> list[dict]:
        """Every hub shard is a thread of this kernel (no engine)."""
        return [{"shard": i, "host": ep.get("host", "").split(":")[0], "engine": None}
                for i, ep in enumerate(endpoints)]

    def failure(self) -> BaseException | None:
        return self._error

    def newly_lost(self) -> list[tuple[int, str]]:
        return []  # the worker is a thread of this kernel: it cannot die alone

    def written_off(self, worker: int) -> None:
        """Nothing to free: the worker is a thread of this kernel, which stays free."""

    def workers_running(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def add_workers(self, engines: list[int], announce) -> list[int]:
        raise ConfigError(f"--mode local trains with one worker thread in this kernel (Received: "
                          f"run.add_workers({list(engines)})). Use --mode async with a cluster to "
                          "add workers while a run trains.")

    def take_over_shards(self, restores: dict[int, tuple], moved) -> list[dict]:
        raise TrainingError("--mode local's hub shards are threads of this kernel: a lost one "
                            f"is not started anew (Received: hub shard(s) {sorted(restores)} "
                            "lost). Use --mode async to survive a lost hub shard.")

    def restart(self, control) -> dict | None:
        return None  # the worker is a thread of this kernel

    def joined_engines(self) -> list[int]:
        return []  # no cluster to join

    def worker_results(self) -> dict[int, object]:
        """What the worker thread returned (its steps), once it has."""
        return {} if self._result is None else {0: self._result}

    def finish(self, timeout: float) -> None:
        if self._worker is not None:
            self._worker.join(timeout)
        self._hubs.join(timeout)
