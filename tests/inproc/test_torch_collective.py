"""`--collective torch` below the modes: the kernel's signed key-value store as ranks and a
stranger meet it, and two rank processes forming a Gloo group from it to broadcast, sum and
step (nbdist.modes.sync.rendezvous.signed_store, nbdist.modes.sync.collective)."""

from __future__ import annotations

import http.client
import importlib.util
import multiprocessing
import threading

import numpy as np
import pytest

from nbdist.errors import ConfigError, DependencyError
from nbdist.hub.protocol import new_key
from nbdist.modes.sync import backend as sync_backend
from nbdist.modes.sync.backend import choose_collective, host_slots
from nbdist.modes.sync.rendezvous import SignedClient, signed_store

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="PyTorch is not installed: pip install 'nbdist[torch]'")


@pytest.fixture
def store():
    key = new_key()
    server = signed_store(("127.0.0.1", 0), key, "run1")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server.server_address[1])}
    try:
        yield server, key, env
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_ranks_set_get_and_delete_and_a_stranger_changes_nothing(store):
    server, key, env = store
    rank = SignedClient(key, "run1", "0", env)
    assert rank.forward("GET", "/torch/6b", b"") == (404, b"")
    assert rank.forward("PUT", "/torch/6b", b"127.0.0.1:4000") == (200, b"")
    assert rank.forward("GET", "/torch/6b", b"") == (200, b"127.0.0.1:4000")
    # the run's id is signed too: a client of another run is refused
    with pytest.raises(Exception, match="not signed"):
        SignedClient(key, "run2", "1", env).forward("PUT", "/torch/6b", b"10.0.0.9:1")
    stranger = SignedClient(new_key(), "run1", "1", env)
    with pytest.raises(Exception, match="not signed"):
        stranger.forward("PUT", "/torch/6b", b"10.0.0.9:1")
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.request("PUT", "/torch/6b", body=b"10.0.0.9:1", headers={"Content-Length": "10"})
    assert conn.getresponse().status == 403
    conn.close()
    assert rank.forward("GET", "/torch/6b", b"") == (200, b"127.0.0.1:4000")
    assert sum(server.rejected.values()) == 3
    assert rank.forward("DELETE", "/torch/6b", b"") == (200, b"")
    assert rank.forward("GET", "/torch/6b", b"") == (404, b"")


def _rank(rank: int, key: bytes, env: dict, out) -> None:
    """One rank in a process of its own: broadcast, a sum, and the Adam step of a tiny model."""
    import os

    os.environ["KERAS_BACKEND"] = "jax" if rank else "torch"  # the group does not care
    import keras

    from nbdist.core.compression import parse
    from nbdist.modes.sync.collective import TorchCollective

    env = {**env, "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": "2", "HOROVOD_GLOO_IFACE": "lo"}
    collective = TorchCollective(SignedClient(key, "run1", str(rank), env), env, 20.0)
    start = collective.broadcast(np.full(3, rank + 1.0, np.float32))
    total = collective.allreduce_sum(np.arange(3, dtype=np.float32) * (rank + 1))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    model.optimizer.build(model.trainable_variables)
    model.layers[0].kernel.assign(np.ones((2, 1), np.float32))
    # rank 0 holds 3 of the global batch's 4 samples, rank 1 one: the weighted sum is the mean
    grad = np.array([1.0, 2.0], np.float32) if rank == 0 else np.array([5.0, 6.0], np.float32)
    weight = 0.75 if rank == 0 else 0.25
    kernels, controls = [], []
    for fp16 in (False, True):  # --compression fp16: the gradient as float16, the control exact
        apply = collective.compile_apply(model, 2, parse("fp16" if fp16 else "none"))
        controls.append(apply(grad, weight, np.array([rank, 1.0 / 3], np.float32)).tolist())
        kernels.append(np.asarray(model.layers[0].kernel.numpy()).ravel().tolist())
    out.put((rank, start.tolist(), total.tolist(), controls, kernels))
    collective.close()


def _two_ranks(target, key: bytes, env: dict, timeout: float) -> list:
    """`target(rank, key, env, out)` in two processes of their own; what each put, by rank."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    ranks = [context.Process(target=target, args=(r, key, env, out)) for r in (0, 1)]
    for process in ranks:
        process.start()
    said = sorted(out.get(timeout=timeout) for _ in ranks)
    for process in ranks:
        process.join(30)
    return said


def test_two_ranks_form_a_gloo_group_from_the_signed_store_and_step_together(store):
    server, key, env = store
    said = _two_ranks(_rank, key, env, timeout=120)
    mean = 0.75 * np.array([1.0, 2.0]) + 0.25 * np.array([5.0, 6.0])  # [2, 3]
    for _, start, total, controls, kernels in said:
        assert start == [1.0, 1.0, 1.0]  # rank 0's
        assert total == [0.0, 3.0, 6.0]
        for control in controls:
            np.testing.assert_allclose(control, [1.0, 2 / 3], rtol=1e-7)
        np.testing.assert_allclose(kernels[0], 1.0 - 0.5 * mean, rtol=1e-6)  # one SGD step
        np.testing.assert_allclose(kernels[1], 1.0 - mean, rtol=1e-6)  # 2 and 3: exact in fp16
    assert not server.rejected


def test_the_collective_is_chosen_by_backend_and_what_is_installed(monkeypatch):
    monkeypatch.setattr(sync_backend, "require_horovod", lambda: None)
    assert choose_collective("auto", "tensorflow") == "horovod"
    assert choose_collective("auto", "jax") == "torch"
    assert choose_collective("torch", "tensorflow") == "torch"
    with pytest.raises(ConfigError, match="Horovod has no jax binding.*--collective torch"):
        choose_collective("horovod", "jax")

    def missing():
        raise DependencyError("no Horovod")

    monkeypatch.setattr(sync_backend, "require_horovod", missing)
    assert choose_collective("auto", "tensorflow") == "torch"  # a machine without Horovod
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DependencyError, match=r"pip install 'nbdist\[torch\]'.*make horovod"):
        choose_collective("auto", "tensorflow")


def test_ranks_are_numbered_host_by_host_as_horovod_numbers_them():
    slots = host_slots({"a": 2, "b": 1})
    assert [(s.hostname, s.rank, s.size, s.local_rank, s.local_size, s.cross_size)
            for s in slots] == [("a", 0, 3, 0, 2, 2), ("a", 1, 3, 1, 2, 2), ("b", 2, 3, 0, 1, 2)]


def _batchnorm_rank(rank: int, key: bytes, env: dict, out) -> None:
    """One rank on Keras's PyTorch or JAX backend (env["KERAS_BACKEND"]) with --sync-batchnorm:
    its share of a global batch of 8 (rank 0 six samples, rank 1 two), one gradient through
    the group's BatchNorm sums (twice on JAX: its compiled step called again, with the shares
    swapped, must read them anew); rank 0 also computes the whole batch's gradient on one
    process (an unpatched copy)."""
    import os

    os.environ["KERAS_BACKEND"] = env["KERAS_BACKEND"]
    import keras

    from nbdist.engine.flatmodel import FlatModel
    from nbdist.modes.sync.collective import TorchCollective

    env = {**env, "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": "2", "HOROVOD_GLOO_IFACE": "lo"}
    collective = TorchCollective(SignedClient(key, "run1", str(rank), env), env, 20.0)

    def build():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 2)).astype("float32")
    model = build()
    flat = FlatModel(model)
    batchnorm = collective.sync_batchnorm(model)
    initial = [w.numpy() for w in model.non_trainable_weights]
    said = []
    for first in (0, 1):  # which rank holds the 6 samples
        share = 0.75 if rank == first else 0.25
        mine = slice(0, 6) if rank == first else slice(6, 8)
        batchnorm.set_share(share)
        for w, value in zip(model.non_trainable_weights, initial, strict=True):
            w.assign(value)  # each step from the same moving statistics
        _, grad, _, nt_after = flat.gradients(x[mine], y[mine])
        weighted = collective.allreduce_sum(grad * share)
        said.append((weighted.tolist(), np.asarray(nt_after).tolist()))
    whole = None
    if rank == 0:
        alone = FlatModel(build())
        _, whole_grad, _, whole_nt = alone.gradients(x, y)
        whole = (whole_grad.tolist(), np.asarray(whole_nt).tolist())
    out.put((rank, said, whole))
    collective.close()


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_sync_batchnorm_takes_the_global_batchs_statistics_and_gradient(store, backend):
    """Two ranks holding 6 and 2 of 8 samples, each normalising with the group's BatchNorm sums
    (PyTorch: an autograd function; JAX: host callbacks inside its compiled step): their
    batch-share-weighted gradients sum to the gradient of the whole batch on one process, and
    both ranks' moving statistics are the whole batch's (without it: each rank's own)."""
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed: pip install 'nbdist[{backend}]'")
    server, key, env = store
    said = _two_ranks(_batchnorm_rank, key, {**env, "KERAS_BACKEND": backend}, timeout=180)
    (_, steps0, whole), (_, steps1, _) = said
    whole_grad, whole_nt = whole
    for (weighted, nt0), (weighted1, nt1) in zip(steps0, steps1, strict=True):
        np.testing.assert_allclose(weighted, whole_grad, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(weighted1, weighted, rtol=1e-6)
        np.testing.assert_allclose(nt0, whole_nt, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(nt1, whole_nt, rtol=1e-5, atol=1e-7)
    assert not server.rejected


def test_sync_batchnorm_through_torch_on_tensorflow_is_refused_before_any_engine_is_used():
    import nbdist
    from tests.helpers import SYNTHETIC_CELL

    with pytest.raises(ConfigError, match=r"--sync-batchnorm allreduces BatchNorm statistics .*"
                       r"\(Received: --sync-batchnorm with --collective torch, which runs "
                       r"torch.distributed on Keras's tensorflow backend\).*KERAS_BACKEND=torch"):
        nbdist.train(SYNTHETIC_CELL, namespace={}, mode="sync", collective="torch",
                     sync_batchnorm=True, cluster=object())  # refused before it is used
