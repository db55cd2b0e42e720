"""The data a cell trains on: NumPy arrays, a finite `tf.data.Dataset`, or a generator function.

Responsible for:
- telling which of those a name holds (without importing TensorFlow for arrays);
- turning a dataset or a generator into NumPy arrays when its decoded tensors fit within the
  in-memory limit (`--in-memory-limit`, 2 GiB by default, measured while reading), so that
  everything downstream works exactly as with arrays;
- otherwise streaming it: each worker reads its own `Dataset.shard(num_workers, worker)` and
  cuts it into the batch sizes the hub assigns (`ShardStream`);
- the two sample sources the training loops read batches from (`ArraySource`, `ShardStream`).

A dataset is taken as batched when its features have as many dimensions as the model's input
(`model.inputs`, batch dimension included) or, when the model does not say (a subclassed
model), when their leading dimension is unknown, as `.batch()` leaves it. A generator yields
batches, as `model.fit` expects, unless its features have one dimension fewer than the model's
input (single samples).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from nbdist.errors import DataError

READ_BATCH = 256  # samples per read when a dataset is unbatched or streamed


def kind_of(value: object) -> str:
    """'dataset', 'generator', 'array' or 'other'; never imports TensorFlow."""
    if any(c.__name__ == "DatasetV2" and c.__module__.startswith("tensorflow") for c in type(value).__mro__):
        return "dataset"
    if inspect.isgeneratorfunction(value):
        return "generator"
    if hasattr(value, "__len__") and hasattr(value, "shape"):
        return "array"
    return "other"


def is_batched(feature_shape: tuple, model_rank: int | None, default: bool) -> bool:
    """Whether elements with features of `feature_shape` are batches (see the module docstring).

    Example:
        >>> is_batched((None, 28, 28), 3, False), is_batched((28, 28), 3, True)
        (True, False)
        >>> is_batched((None, 10), None, False), is_batched((32, 10), None, False)
        (True, False)
    """
    if model_rank is not None and len(feature_shape) in (model_rank, model_rank - 1):
        return len(feature_shape) == model_rank
    if feature_shape and feature_shape[0] is None:
        return True
    return default


def model_rank(model) -> int | None:
    """The rank of the model's input, batch dimension included; None when it is not declared."""
    try:
        inputs = model.inputs
    except Exception:  # noqa: BLE001 - subclassed and unbuilt models raise various errors
        return None
    return len(inputs[0].shape) if inputs and len(inputs) == 1 else None


@dataclass
class Loaded:
    """Training or validation data as found: arrays, or a dataset to stream."""

    x: np.ndarray | None  # every sample; None when streamed
    y: np.ndarray | None
    num_samples: int | None  # None on an engine that streams (the kernel counted)
    dataset: object = None  # streamed: the unbatched tf.data.Dataset
    head: tuple = ()  # (x, y) of the first samples: for the checks and for tracing

    @property
    def streamed(self) -> bool:
        return self.x is None


def load(value: object, name: str, flag: str, model, limit: int | None, count: bool = True) -> Loaded:
    """A dataset or a generator function as arrays when it fits within `limit` bytes (None: no
    limit), else streamed (0: always streamed); `count` the samples of a streamed one."""
    import tensorflow as tf

    batched = as_batched(value, name, flag, model)
    parts_x, parts_y, size, total = [], [], 0, 0
    if limit is None or limit > 0:
        for bx, by in batched.as_numpy_iterator():
            size += bx.nbytes + by.nbytes
            if limit is not None and size > limit:
                break
            parts_x.append(bx)
            parts_y.append(by)
            total += len(bx)
        else:
            if total == 0:
                raise DataError(f"{flag} {name} yields no samples: there is nothing to train on.")
            x, y = np.concatenate(parts_x), np.concatenate(parts_y)
            return Loaded(x, y, total, head=(x[:2], y[:2]))
    if count:
        total = int(batched.reduce(np.int64(0), lambda n, e: n + tf.shape(e[0], out_type=tf.int64)[0]))
        if total == 0:
            raise DataError(f"{flag} {name} yields no samples: there is nothing to train on.")
    head = next(batched.unbatch().batch(2).as_numpy_iterator())
    return Loaded(None, None, total if count else None, dataset=batched.unbatch(), head=tuple(head))


def as_batched(value: object, name: str, flag: str, model):
    """`value` (a dataset or a generator function) as a batched tf.data.Dataset of (x, y)."""
    import tensorflow as tf

    rank = model_rank(model)
    if kind_of(value) == "generator":
        first = next(iter(value()), None)
        if not (isinstance(first, tuple) and len(first) == 2):
            raise DataError(f"{flag} {name}: the generator function yields {_shown(first)}, expected "
                            "(features, labels) pairs of arrays. Yield x_batch, y_batch.")
        x, y = (np.asarray(a) for a in first)
        batched = is_batched(x.shape, rank, True)
        signature = tuple(tf.TensorSpec(((None, *a.shape[1:]) if batched else a.shape), tf.as_dtype(a.dtype))
                          for a in (x, y))
        dataset = tf.data.Dataset.from_generator(value, output_signature=signature)
        return dataset if batched else dataset.batch(READ_BATCH)
    spec = value.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(s, tf.TensorSpec) for s in spec)):
        raise DataError(
            f"{flag} {name} yields {spec}, expected (features, labels) pairs of single tensors. "
            f"Map it to pairs, e.g. {name} = {name}.map(lambda x, y, *rest: (x, y)), or pass arrays "
            f"as {flag} X,Y.")
    if int(value.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        raise DataError(
            f"{flag} {name} is infinite (it repeats without a count), so it has no epochs. Drop "
            f".repeat() (nbdist runs --epochs passes itself), or make it finite with "
            f"{name}.take(n).")
    shape = tuple(spec[0].shape.as_list()) if spec[0].shape.rank is not None else (None,)
    return value if is_batched(shape, rank, False) else value.batch(READ_BATCH)


def validation_arrays(ns: dict, names: tuple[str, ...] | None, model) -> tuple | None:
    """The validation data as arrays: two arrays, or one dataset read into memory."""
    if not names:
        return None
    if len(names) == 1:
        loaded = load(ns[names[0]], names[0], "--validation", model, limit=None)
        return loaded.x, loaded.y
    return tuple(ns[n] for n in names)


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return type(value).__name__


def streaming_note(name: str, num_samples: int, limit: int) -> str:
    """The sentence a streamed run's warnings carry."""
    return (f"{name} holds more than --in-memory-limit {format_size(limit)} of decoded tensors, so "
            f"it is streamed: each worker reads only its own shard ({name}.shard(num_workers, "
            f"worker)); an epoch still counts {num_samples} samples across workers, but a faster "
            "worker goes through its own shard more often instead of taking more distinct samples. "
            "Raise --in-memory-limit to hold it in memory.")


def format_size(num_bytes: int) -> str:
    """2147483648 -> '2GiB'; 1536 -> '1.5KiB'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= size:
            return f"{num_bytes / size:g}{unit}"
    return f"{num_bytes}B"


def as_float32(x: np.ndarray) -> np.ndarray:
    """Inputs as Keras trains on them: float64 becomes float32 once, here, not per batch;
    other dtypes (integer token ids, float16) stay as they are."""
    return x.astype(np.float32) if x.dtype == np.float64 else x


class ArraySource:
    """Batches from arrays: positions `[start, stop)` of the epoch's global permutation."""

    def __init__(self, x: np.ndarray, y: np.ndarray, num_samples: int, seed: int):
        self.x, self.y, self.num_samples, self.seed = x, y, num_samples, seed
        self._epoch, self._perm = -1, None

    def batch(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        index = self.indices(epoch, start, stop)
        return self.x[index], self.y[index]

    def indices(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """The samples of `batch(epoch, start, stop)`, as indices into `x` and `y` (int64)."""
        if epoch != self._epoch:
            from nbdist.core.schedule import epoch_permutation

            self._perm, self._epoch = epoch_permutation(self.num_samples, self.seed, epoch), epoch
        return self._perm[start:stop]

    def head(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[:n], self.y[:n]


class ShardStream:
    """Batches from this worker's shard of a streamed dataset: only a chunk's size matters
    (`stop - start` samples, in the shard's order); at its end the shard starts a new pass."""

    def __init__(self, dataset, num_workers: int, worker: int, read_batch: int = READ_BATCH):
        self.worker, self.num_workers = worker, num_workers
        self.dataset = dataset.shard(num_workers, worker).batch(read_batch)
        self._iter = None
        self._buffer: list[tuple[np.ndarray, np.ndarray]] = []
        self._buffered = 0
        self.passes = 0  # passes over the shard begun

    def batch(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        return self.take(stop - start)

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next `n` samples of the shard."""
        if n <= 0:
            return self.head(0)
        fresh = False
        while self._buffered < n:
            if self._iter is None:
                self._iter, self.passes, fresh = self.dataset.as_numpy_iterator(), self.passes + 1, True
            part = next(self._iter, None)
            if part is None:
                if fresh:
                    self.head(1)  # raises: the shard is empty
                self._iter = None
                continue
            fresh = False
            self._buffer.append((as_float32(part[0]), part[1]))
            self._buffered += len(part[0])
        x = np.concatenate([b[0] for b in self._buffer]) if len(self._buffer) > 1 else self._buffer[0][0]
        y = np.concatenate([b[1] for b in self._buffer]) if len(self._buffer) > 1 else self._buffer[0][1]
        self._buffer = [(x[n:], y[n:])] if len(x) > n else []
        self._buffered = len(x) - n
        return x[:n], y[:n]

    def head(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The shard's first `n` samples (or fewer), without moving the stream."""
        first = next(self.dataset.unbatch().batch(max(n, 1)).as_numpy_iterator(), None)
        if first is None:
            raise DataError(f"Worker {self.worker}'s shard of the streamed data is empty (1 of "
                            f"every {self.num_workers} samples). Use fewer workers or more data.")
        return first[0][:n], first[1][:n]
