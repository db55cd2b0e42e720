"""What averages a `--mode sync` step between the ranks (`--collective`), on the rank's side.

A rank's loop (`nbdist.modes.sync.rank`) asks its collective for five things: the rank and the
number of ranks, rank 0's buffer on every rank (`broadcast`), a sum of a small NumPy buffer on
every rank (`allreduce_sum`: the control, the final BatchNorm state), this rank's gradient for a
batch (`gradients`), and one step of the cell's optimizer on the batch-weighted sum of every
rank's gradient, with the control riding in the same allreduce (`allreduce_apply`).

- `HorovodCollective` (TensorFlow only): Horovod's allreduce inside one compiled TensorFlow
  function, the gradient kept a tensor from the step to the update (no host copy).
- `TorchCollective` (every Keras backend): a Gloo process group of `torch.distributed`, made
  without its global state (`ProcessGroupGloo`, so an engine that runs many runs keeps nothing
  between them), from the kernel's signed store (`rank_store`). The gradient is the flat NumPy
  buffer every backend's step already gives (`nbdist.engine.flatmodel`); the allreduce works in
  place on it through `torch.from_numpy` (no copy), and the cell's own Keras optimizer applies
  it on the model's backend. Gloo binds the interface towards the kernel (`GLOO_SOCKET_IFNAME`'s
  job, given here as the device's interface), and its traffic is neither signed nor encrypted,
  as Horovod's Gloo is not (docs/security.md).
- `--compression powersgd:R` (either collective): PowerSGD's two allreduces, of P and of Q, on
  NumPy buffers (`nbdist.core.low_rank.LowRankReducer`), then the cell's optimizer as the torch
  collective applies it (`_exchange_apply`).
- `--compression int8`, `qsgd:S`, `topk:R`, `randomk:R` (either collective): an allgather of
  every rank's frame, each summed in rank order (`nbdist.core.gathered.GatheredFrames`), then
  the cell's optimizer (`_exchange_apply`).
"""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np

from nbdist.core.compression import Codec
from nbdist.core.gathered import GatheredFrames
from nbdist.core.low_rank import LowRankReducer
from nbdist.engine.flat_apply import flat_apply
from nbdist.engine.flat_layout import write_non_trainable
from nbdist.engine.flat_step import StatelessFlatModel
from nbdist.modes.sync.batchnorm import SyncBatchNorm, TorchSyncBatchNorm
from nbdist.modes.sync.rendezvous import SignedClient

STORE_POLL_S = 0.01  # how often a rank asks the kernel's store for a key Gloo waits on


def _exchange_apply(model, flat_size: int, coder, sum_p, sum_q, gather):
    """`(grad, weight, control) -> summed control` for a codec's own exchange, on NumPy
    buffers: this rank's weighted gradient, with the control, through `coder` (the rank's for
    the whole run: its error feedback, powersgd's Qs, outlive a recompile for a new rate), then
    the cell's optimizer. A `LowRankReducer` (powersgd) sums P and Q over the ranks in place
    (`sum_p`, `sum_q`); `GatheredFrames` (the other codecs) takes every rank's message from
    `gather(message)`, one row each, in rank order."""
    apply = flat_apply(model)
    weighted = np.empty(flat_size, dtype=np.float32)
    if isinstance(coder, LowRankReducer):
        def exchange(control):
            return coder.reduce(weighted, control, sum_p, sum_q)
    else:
        def exchange(control):
            return coder.sum(gather(coder.message(weighted, control)))

    def allreduce_apply(grad, weight, control: np.ndarray) -> np.ndarray:
        np.multiply(np.asarray(grad, dtype=np.float32), np.float32(weight), out=weighted)
        gradient, summed_control = exchange(control)
        apply(gradient)
        return summed_control.copy()

    return allreduce_apply


class HorovodCollective:
    """Horovod's TensorFlow ops; every collective has a fixed name, because Horovod matches them
    by name and Keras variable names differ between processes."""

    def __init__(self, hvd):
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()

    def sync_batchnorm(self, model):
        """--sync-batchnorm on this rank: BatchNorm statistics over the global batch, allreduced
        by Horovod inside the forward pass."""
        return SyncBatchNorm(model, self.hvd)

    def broadcast(self, flat: np.ndarray) -> np.ndarray:
        import tensorflow as tf  # TensorFlow: only where a rank runs

        return self.hvd.broadcast(tf.constant(flat), root_rank=0,
                                  name="nbdist_initial_weights").numpy()

    def allreduce_sum(self, array: np.ndarray, name: str = "nbdist_control") -> np.ndarray:
        return self.hvd.allreduce(array, op=self.hvd.Sum, name=name).numpy()

    def gradients(self, flat, batch: tuple) -> tuple[float, object, float]:
        return flat.gradients_tensor(*batch)  # the gradient stays a tensor

    def compile_apply(self, model, flat_size: int, codec: Codec,
                      coder: LowRankReducer | GatheredFrames | None = None):
        """The compiled step that allreduces the weighted gradient with the control and applies
        it with the cell's optimizer: `(grad, weight, control) -> summed control`. `coder`: a
        codec's own exchange, on NumPy buffers (`_exchange_apply`)."""
        import tensorflow as tf  # TensorFlow: only where a rank runs

        hvd, optimizer, trainable = self.hvd, model.optimizer, model.trainable_variables
        if coder is not None:  # each collective named, as Horovod matches them by name
            return _exchange_apply(
                model, flat_size, coder,
                lambda b: np.copyto(b, self.allreduce_sum(b, "nbdist_p")),
                lambda b: np.copyto(b, self.allreduce_sum(b, "nbdist_q")),
                lambda m: hvd.allgather(tf.constant(m[None]), name="nbdist_frames").numpy())
        fp16 = codec.name == "fp16"
        sizes = [int(np.prod(v.shape)) for v in trainable]

        @tf.function(reduce_retracing=True)
        def allreduce_apply(grad, weight, control):
            weighted_grad = grad * weight  # this rank's share of the global batch
            if fp16:  # the gradient travels as float16 (Horovod's own compression); control exact
                reduced = tf.concat([hvd.allreduce(weighted_grad, op=hvd.Sum,
                                                   name="nbdist_gradient",
                                                   compression=hvd.Compression.fp16),
                                     hvd.allreduce(control, op=hvd.Sum, name="nbdist_control")], 0)
            else:
                reduced = hvd.allreduce(tf.concat([weighted_grad, control], 0), op=hvd.Sum,
                                        name="nbdist_gradient")
            grads = tf.split(reduced[:flat_size], sizes)
            optimizer.apply_gradients(zip([tf.reshape(g, v.shape)
                                           for g, v in zip(grads, trainable, strict=True)],
                                          trainable, strict=True))
            return reduced[flat_size:]

        return lambda grad, weight, control: allreduce_apply(grad, weight, control).numpy()

    def close(self) -> None:
        self.hvd.shutdown()  # a failing rank ends the collective for all; the next run inits again


class TorchCollective:
    """A Gloo process group of `torch.distributed` on flat NumPy buffers (see the module
    docstring). `env` is the rank's (HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_GLOO_IFACE resolved
    to an interface by `nbdist.modes.sync.network.rank_network`)."""

    def __init__(self, client: SignedClient, env: dict, timeout_s: float):
        import torch.distributed as dist  # PyTorch: only where a torch rank runs

        self.rank, self.size = int(env["HOROVOD_RANK"]), int(env["HOROVOD_SIZE"])
        # Gloo's options have no public setters in torch 2.13 (its device and timeout: tried here)
        options = dist.ProcessGroupGloo._Options()  # noqa: SLF001
        options._timeout = timedelta(seconds=timeout_s)  # noqa: SLF001
        options._devices = [dist.ProcessGroupGloo.create_device(  # noqa: SLF001
            interface=env["HOROVOD_GLOO_IFACE"])]
        self.store = rank_store(client, timeout_s)
        self.group = dist.ProcessGroupGloo(self.store, self.rank, self.size, options)
        self._buffer = np.zeros(0, np.float32)  # the weighted gradient and the control

    def _sum(self, array: np.ndarray) -> np.ndarray:
        """`array` summed over the ranks, in place (torch.from_numpy shares its memory)."""
        import torch  # PyTorch: only where a torch rank runs

        self.group.allreduce([torch.from_numpy(array)]).wait()
        return array

    def _gather(self, message: np.ndarray) -> np.ndarray:
        """Every rank's `message` (the same length on each), one row per rank in rank order."""
        import torch  # PyTorch: only where a torch rank runs

        rows = np.empty((self.size, message.size), dtype=message.dtype)
        self.group.allgather([[torch.from_numpy(row) for row in rows]],
                             [torch.from_numpy(message)]).wait()
        return rows

    def broadcast(self, flat: np.ndarray) -> np.ndarray:
        import torch  # PyTorch: only where a torch rank runs

        out = np.ascontiguousarray(flat, dtype=np.float32).copy()
        self.group.broadcast(torch.from_numpy(out), 0).wait()
        return out

    def allreduce_sum(self, array: np.ndarray, name: str = "") -> np.ndarray:
        return self._sum(np.array(array, dtype=np.float32))

    def sync_batchnorm(self, model):
        """--sync-batchnorm on this rank: BatchNorm statistics over the global batch, through
        this group (Keras's PyTorch and JAX backends: the start refuses TensorFlow)."""
        return TorchSyncBatchNorm(model, self.group)

    def gradients(self, flat, batch: tuple) -> tuple[float, np.ndarray, float]:
        """This rank's gradient as a NumPy buffer; a stateless step's new non-trainable state
        (BatchNorm's moving statistics) written into the model, as TensorFlow's step does."""
        loss, grad, norm, nt_after = flat.gradients(*batch)
        if isinstance(flat, StatelessFlatModel) and flat.nt_size:
            write_non_trainable(flat.model, nt_after)
        return loss, grad, norm

    def compile_apply(self, model, flat_size: int, codec: Codec,
                      coder: LowRankReducer | GatheredFrames | None = None):
        """`(grad, weight, control) -> summed control`: one allreduce of the weighted gradient
        and the control in one buffer (fp16: the gradient as float16, the control exact;
        a `coder`: `_exchange_apply`), then the cell's optimizer, compiled on the model's
        backend (`nbdist.engine.flat_apply`)."""
        if coder is not None:
            return _exchange_apply(model, flat_size, coder, self._sum, self._sum, self._gather)
        apply, fp16 = flat_apply(model), codec.name == "fp16"

        def allreduce_apply(grad: np.ndarray, weight, control: np.ndarray) -> np.ndarray:
            size = flat_size + control.size
            if self._buffer.size != size:
                self._buffer = np.empty(size, np.float32)
            buffer = self._buffer
            np.multiply(grad, np.float32(weight), out=buffer[:flat_size])
            buffer[flat_size:] = control
            if fp16:
                half = buffer[:flat_size].astype(np.float16)
                self._sum(half)
                buffer[:flat_size] = half
                self._sum(buffer[flat_size:])
            else:
                self._sum(buffer)
            apply(buffer[:flat_size])
            return buffer[flat_size:].copy()

        return allreduce_apply

    def close(self) -> None:
        self.group = None  # its threads and sockets end with it (no global state to destroy)


def rank_store(client: SignedClient, timeout_s: float):
    """A `torch.distributed.Store` whose every request is signed with the run's key and checked
    against the kernel's signed reply (`nbdist.modes.sync.rendezvous.signed_store`). Gloo's
    process group asks it `set`, `get` and `wait` only; `check` and `delete_key` are here for
    completeness."""
    return _signed_store_class()(client, timeout_s)


_STORE_CLASS = None


def _signed_store_class():
    """The Store subclass, defined once PyTorch is imported (a rank that needs it)."""
    global _STORE_CLASS
    if _STORE_CLASS is not None:
        return _STORE_CLASS
    import torch.distributed as dist  # PyTorch: only where a torch rank runs

    class _SignedStore(dist.Store):
        def __init__(self, client: SignedClient, timeout_s: float):
            super().__init__()
            self.client, self.timeout_s = client, timeout_s

        @staticmethod
        def _path(key: str) -> str:
            return "/torch/" + key.encode().hex()  # Gloo's keys hold "/": hex keeps one segment

        def set(self, key: str, value) -> None:
            status, _ = self.client.forward("PUT", self._path(key), bytes(value))
            if status != 200:
                raise dist.DistStoreError(f"the kernel's store refused to set {key!r} "
                                          f"(HTTP {status})")

        def _read(self, key: str) -> bytes | None:
            status, data = self.client.forward("GET", self._path(key), b"")
            return data if status == 200 else None

        def get(self, key: str) -> bytes:
            self.wait([key])
            value = self._read(key)
            if value is None:
                raise dist.DistStoreError(f"{key!r} left the kernel's store while read")
            return value

        def check(self, keys: list[str]) -> bool:
            return all(self._read(k) is not None for k in keys)

        def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
            limit = self.timeout_s if timeout is None else timeout.total_seconds()
            deadline = time.monotonic() + limit
            missing = list(keys)
            while missing:
                missing = [k for k in missing if self._read(k) is None]
                if not missing:
                    return
                if time.monotonic() > deadline:
                    raise dist.DistStoreError(
                        f"Timed out after {limit:g} s waiting for {missing} in the kernel's "
                        "store: a rank did not come (its engine died or is unreachable)")
                time.sleep(STORE_POLL_S)

        def delete_key(self, key: str) -> bool:
            status, _ = self.client.forward("DELETE", self._path(key), b"")
            return status == 200

    _STORE_CLASS = _SignedStore
    return _STORE_CLASS
