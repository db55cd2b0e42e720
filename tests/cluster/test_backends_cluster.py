"""The keras.io convnet cell, unchanged, on Keras's JAX and PyTorch backends on a real cluster:
sync with 2 ranks (torch.distributed) and pipeline with 2 stages finish within 0.03 of Keras's
own fit on the same backend, and the engines' Keras runs that backend; async with 2 workers,
with a rule, DBS, local steps, overlap and BSP, within 0.1 of fit on a smaller cell (--mode
local on each backend: tests/inproc/test_backends.py, in the kernel, as local runs).
An engine whose Keras already runs another backend is refused, naming it. Each backend runs
in a child process with its own cluster (tests/backend_child.py): Keras picks its backend once
per process, engines included."""

from __future__ import annotations

import pytest

from tests.inproc.test_backends import child, start_child

TOLERANCE = 0.03
BACKENDS = ("jax", "torch")
pytestmark = [pytest.mark.cluster, pytest.mark.slow]


_SAID: dict[str, dict | Exception] = {}  # what each backend's child said, or how it failed


def on_a_cluster(backend: str) -> dict:
    """The child's runs on one cluster of this backend (`tests.backend_child.on_a_cluster`):
    started once for both tests below, since engines that import Keras cost a minute. Both
    backends' children start together: much of each one's time is waiting for its engines and
    compiling, which the other's fills."""
    if not _SAID:
        pending = {b: start_child("on_a_cluster", backend=b, timeout=1300) for b in BACKENDS}
        for b, said in pending.items():  # each child waited for, whichever fails
            try:
                _SAID[b] = said()
            except Exception as exc:  # noqa: BLE001 - raised by this backend's tests alone
                _SAID[b] = exc
    said = _SAID[backend]
    if isinstance(said, Exception):
        raise said
    return said


@pytest.mark.timeout(1400)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_keras_io_convnet_trains_on_the_backend_in_sync_and_pipeline_as_fit_does(backend):
    said = on_a_cluster(backend)["convnet"]
    print(backend, said, on_a_cluster(backend)["seconds"])  # the figures, for `pytest -rP`
    assert said["backend"] == backend
    assert (f"Keras backend: {backend} (the kernel's; every worker runs the cell on it)"
            in said["sync_events"])
    assert said["fit"] > 0.7  # the cell learnt (3 epochs on 6,000 images)
    # sync with 2 ranks: torch.distributed's Gloo group (Horovod has no binding here)
    assert said["sync"] >= said["fit"] - TOLERANCE, (backend, said)
    assert any(t.startswith("--collective auto: torch.distributed's allreduce")
               for t in said["sync_events"]), said["sync_events"]
    # pipeline with 2 stages, one micro-batch: the stages' passes on this backend (jax.vjp,
    # autograd), the call's 3 epochs with the kernel validating at each epoch's end
    assert said["pipeline"] >= said["fit"] - TOLERANCE, (backend, said)
    assert said["pipeline_epochs"] == [0, 1, 2]
    # the sync ranks and the stages ran the cell on this backend
    ran = [e for e in said["engines"] if e is not None]
    assert len(ran) >= 2 and set(ran) == {backend}
    if backend == "torch":  # --sync-batchnorm through the torch collective's Gloo group
        bn = on_a_cluster(backend)["sync_batchnorm"]
        assert bn["status"] == "finished" and bn["accuracy"] > 0.4, bn  # (chance: 0.1)
        assert bn["ranks_differ"] < 1e-5, bn  # each rank's own statistics: the global batch's


@pytest.mark.timeout(1400)
@pytest.mark.parametrize("backend", BACKENDS)
def test_async_with_a_rule_dbs_local_steps_overlap_and_bsp_trains_on_the_backend_as_fit_does(
        backend):
    from tests.backend_child import ASYNC_RUNS

    said = on_a_cluster(backend)["async_options"]
    print(backend, said)  # the accuracies, for `pytest -rP`
    assert said["backend"] == backend and set(said["runs"]) == set(ASYNC_RUNS)
    for name, accuracy in said["runs"].items():
        assert accuracy >= said["fit"] - 0.1, (backend, name, accuracy, said["fit"])


@pytest.mark.timeout(300)
def test_an_engine_whose_keras_runs_another_backend_is_refused_with_what_to_do():
    said = child("mismatch", backend="jax", timeout=280)
    assert "runs on the tensorflow backend, but the kernel's runs on jax" in said["error"]
    assert "Restart the engines" in said["error"] and "engine " in said["error"]
