"""The data a cell trains on: NumPy arrays, a finite `tf.data.Dataset`, a generator function, or
(on any backend, with PyTorch installed) a `torch.utils.data.DataLoader`, read as a generator.

Responsible for:
- telling which of those a value is, once: `data_adapter(value)` picks one `DataAdapter` per
  kind (as Keras's `get_data_adapter` does), and the callers ask it what the kind can do
  instead of testing types (without importing TensorFlow or PyTorch for that);
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
from itertools import islice
from typing import Protocol

import numpy as np

from nbdist.core.schedule import epoch_permutation
from nbdist.errors import DataError

READ_BATCH = 256  # samples per read when a dataset is unbatched or streamed


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


# -- the kinds of data, one adapter each -------------------------------------------------------


class DataAdapter:
    """One kind of data a cell can give, wrapping the value: what nbdist may do with that kind.
    `data_adapter(value)` chooses the adapter once; the callers ask it, not the value's type.

    Each kind says:
    - `name`: how a message names the kind;
    - `streams`: `load` reads it, into memory or streamed by shards (one name: `--data NAME`);
    - `ships`: it can travel to the engines by value (a tf.data.Dataset cannot: the cell builds
      it there);
    - `replayed`: given to `model.fit` as x, its batches are read once and replayed each epoch;
    - `handles(value)`: whether `value` is of this kind.
    A kind that streams implements `batched`; one that is replayed, `batches`.

    Example:
        >>> adapter = data_adapter(np.zeros((4, 2)))
        >>> type(adapter).__name__, adapter.streams, adapter.ships
        ('ArrayAdapter', False, True)
    """

    name = "value"
    streams = False
    ships = True
    replayed = False

    def __init__(self, value: object):
        self.value = value

    @staticmethod
    def handles(value: object) -> bool:
        raise NotImplementedError

    def batched(self, name: str, flag: str, model, finite: bool = False):
        """The data as a batched tf.data.Dataset of (x, y) or (x, y, sample_weight) elements, x
        and y nested or not, and whether it came batched (then its batches are the model's batch
        size, as in `fit`). `finite`: the caller takes a finite part itself (a repeating dataset
        is then allowed)."""
        raise TypeError(f"{type(self).__name__} does not stream (ask its `streams` first)")

    def batches(self, steps: int | None):
        """The batches `model.fit` would read in one epoch (`steps`: its steps_per_epoch)."""
        raise TypeError(f"{type(self).__name__} is not replayed (ask its `replayed` first)")

    def infinite(self) -> bool:
        """Whether it repeats without end (then only `steps_per_epoch` makes an epoch of it)."""
        return False


def _has_class(value: object, name: str, module: str) -> bool:
    """Whether `value`'s class or a base is `module`'s (a prefix) `name`, without importing it."""
    return any(c.__name__ == name and c.__module__.startswith(module) for c in type(value).__mro__)


class TFDatasetAdapter(DataAdapter):
    """A `tf.data.Dataset`: read into memory or streamed; built by the cell on each engine."""

    name = "tf.data.Dataset"
    streams = True
    ships = False

    @staticmethod
    def handles(value: object) -> bool:
        return _has_class(value, "DatasetV2", "tensorflow")

    def batched(self, name: str, flag: str, model, finite: bool = False):
        import tensorflow as tf  # TensorFlow: only for tf.data input

        value = self.value
        spec = value.element_spec
        if not (isinstance(spec, tuple) and len(spec) in (2, 3)
                and all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec))):
            raise DataError(
                f"{flag} {name} yields {spec}, expected (features, labels) pairs (or triples "
                "with sample weights) of tensors or of lists or dicts of tensors. Map it to "
                f"pairs, e.g. {name} = {name}.map(lambda x, y, *rest: (x, y)), or pass arrays "
                f"as {flag} X,Y.")
        if self.infinite() and not finite:
            raise DataError(
                f"{flag} {name} is infinite (it repeats without a count), so it has no epochs. "
                f"Drop .repeat() (nbdist runs --epochs passes itself), make it finite with "
                f"{name}.take(n), or say how many batches make an epoch with "
                "model.fit(..., steps_per_epoch=N).")
        first = tf.nest.flatten(spec[0])[0]
        shape = tuple(first.shape.as_list()) if first.shape.rank is not None else (None,)
        return ((value, True) if is_batched(shape, model_rank(model), False)
                else (value.batch(READ_BATCH), False))

    def infinite(self) -> bool:
        import tensorflow as tf  # TensorFlow: only for tf.data input

        return int(self.value.cardinality()) == int(tf.data.INFINITE_CARDINALITY)


class GeneratorFunctionAdapter(DataAdapter):
    """A generator function (called for each pass) yielding (x, y[, sample_weight]) batches, or
    single samples when its features have one dimension fewer than the model's input."""

    name = "generator"
    streams = True

    @staticmethod
    def handles(value: object) -> bool:
        return inspect.isgeneratorfunction(value)

    def batched(self, name: str, flag: str, model, finite: bool = False):
        import tensorflow as tf  # TensorFlow: only for streamed data

        first = next(iter(self.value()), None)
        if not (isinstance(first, tuple) and len(first) in (2, 3)):
            raise DataError(f"{flag} {name}: the generator function yields {_shown(first)}, "
                            "expected (features, labels) pairs of arrays (or triples with sample "
                            "weights). Yield x_batch, y_batch.")
        first = tf.nest.map_structure(np.asarray, first)
        batched = is_batched(tf.nest.flatten(first[0])[0].shape, model_rank(model), True)
        signature = tf.nest.map_structure(
            lambda a: tf.TensorSpec(((None, *a.shape[1:]) if batched else a.shape),
                                    tf.as_dtype(a.dtype)), first)
        dataset = tf.data.Dataset.from_generator(self.value, output_signature=signature)
        return (dataset, True) if batched else (dataset.batch(READ_BATCH), False)


class TorchDataLoaderAdapter(DataAdapter):
    """A `torch.utils.data.DataLoader` (any backend, PyTorch installed): read through tf.data
    as a generator function of NumPy batches."""

    name = "torch DataLoader"
    streams = True

    @staticmethod
    def handles(value: object) -> bool:
        return _has_class(value, "DataLoader", "torch.utils.data")

    def batched(self, name: str, flag: str, model, finite: bool = False):
        return GeneratorFunctionAdapter(loader_batches(self.value)).batched(name, flag, model,
                                                                            finite)


class PyDatasetAdapter(DataAdapter):
    """A `keras.utils.PyDataset` given to `model.fit`: its batches by index, read once."""

    name = "PyDataset"
    replayed = True

    @staticmethod
    def handles(value: object) -> bool:
        return _has_class(value, "PyDataset", "keras")

    def batches(self, steps: int | None):
        count = len(self.value) if steps is None else min(len(self.value), steps)
        return (self.value[i] for i in range(count))


class IteratorAdapter(DataAdapter):
    """A Python iterator (a generator's object, `iter(...)`) given to `model.fit`: its batches
    read once, `steps` of them when given."""

    name = "iterator"
    replayed = True

    @staticmethod
    def handles(value: object) -> bool:
        return hasattr(value, "__next__") and hasattr(value, "__iter__")

    def batches(self, steps: int | None):
        return islice(self.value, steps) if steps else self.value


class ArrayAdapter(DataAdapter):
    """An array (NumPy's, or anything with a length and a shape): taken as it is."""

    name = "array"

    @staticmethod
    def handles(value: object) -> bool:
        return hasattr(value, "__len__") and hasattr(value, "shape")


class OtherAdapter(DataAdapter):
    """Anything else (None included): nbdist can do nothing with it; the callers refuse it."""

    name = "other"

    @staticmethod
    def handles(value: object) -> bool:
        return True


# in the order they are asked: the first that handles a value is its kind
ADAPTERS: tuple[type[DataAdapter], ...] = (
    TFDatasetAdapter, TorchDataLoaderAdapter, GeneratorFunctionAdapter, PyDatasetAdapter,
    IteratorAdapter, ArrayAdapter, OtherAdapter)


def data_adapter(value: object) -> DataAdapter:
    """The adapter of `value`'s kind (an adapter is returned as it is); never imports TensorFlow
    or PyTorch.

    Example:
        >>> def gen():
        ...     yield np.zeros((2, 3)), np.zeros(2)
        >>> [type(data_adapter(v)).__name__ for v in (gen, gen(), 5)]
        ['GeneratorFunctionAdapter', 'IteratorAdapter', 'OtherAdapter']
    """
    if isinstance(value, DataAdapter):
        return value
    return next(kind for kind in ADAPTERS if kind.handles(value))(value)



@dataclass
class Loaded:
    """Training or validation data as found: arrays (nested for several inputs or outputs, and
    per-sample weights when the data has a third element), or a dataset to stream."""

    x: object  # every sample; None when streamed
    y: object
    num_samples: int | None  # None on an engine that streams (the kernel counted)
    dataset: object = None  # streamed: the unbatched tf.data.Dataset
    head: tuple = ()  # (x, y[, sample_weight]) of the first samples: for the checks and for tracing
    sample_weight: object = None
    batch_hint: int | None = None  # a dataset that came batched: the size of its first batch

    @property
    def streamed(self) -> bool:
        return self.x is None


def concat(parts: list):
    """Batches (tuples of arrays, or of nested structures of arrays) joined into one."""
    import keras  # Keras: after the cell picks its backend

    return keras.tree.map_structure(lambda *a: np.concatenate(a), *parts)


def nbytes(element) -> int:
    return sum(a.nbytes for a in leaves(element))


def load(value: object, name: str, flag: str, model, limit: int | None, count: bool = True,
         take_batches: int | None = None) -> Loaded:
    """A streaming kind of data (a dataset, a generator function, a DataLoader, or its
    `DataAdapter`) as arrays when it fits within `limit` bytes (None: no limit), else streamed
    (0: always streamed); `count` the samples of a streamed one. `take_batches`: only that many
    batches (`fit(steps_per_epoch=...)` on a repeating dataset)."""
    import tensorflow as tf  # TensorFlow: only for streamed data

    batched, came_batched = data_adapter(value).batched(name, flag, model,
                                                        finite=take_batches is not None)
    hint = None  # came batched: its batches are the model's
    if take_batches is not None:
        batched = batched.take(take_batches)
    parts, size, total = [], 0, 0
    if limit is None or limit > 0:
        for element in batched.as_numpy_iterator():
            size += nbytes(element)
            if limit is not None and size > limit:
                break
            parts.append(tuple(element))
            total += num_rows(element[0])
            if hint is None and came_batched:
                hint = total
        else:
            if total == 0:
                raise DataError(f"{flag} {name} yields no samples: there is nothing to train on.")
            whole = concat(parts)
            head = tuple(take(part, slice(0, 2)) for part in whole)
            return Loaded(whole[0], whole[1], total, head=head,
                          sample_weight=whole[2] if len(whole) > 2 else None, batch_hint=hint)
    if count:
        total = int(batched.reduce(np.int64(0), lambda n, e: n + tf.shape(
            tf.nest.flatten(e[0])[0], out_type=tf.int64)[0]))
        if total == 0:
            raise DataError(f"{flag} {name} yields no samples: there is nothing to train on.")
    head = next(batched.unbatch().batch(2).as_numpy_iterator())
    return Loaded(None, None, total if count else None, dataset=batched.unbatch(), head=tuple(head))


def loader_batches(loader):
    """A `torch.utils.data.DataLoader` as a generator function of NumPy batches: (x, y) or
    (x, y, sample_weight) tuples, x and y nested or not, as Keras's `fit` reads it."""

    def numpy(t):
        return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)

    def batches():
        for batch in loader:
            yield (tuple(map_nested(numpy, list(batch))) if isinstance(batch, (list, tuple))
                   else batch)

    return batches


def validation_arrays(ns: dict, names: tuple[str, ...] | None, model) -> tuple | None:
    """The validation data as arrays: (x, y[, sample_weight]) by name, or one dataset read into
    memory."""
    if not names:
        return None
    if len(names) == 1:
        loaded = load(ns[names[0]], names[0], "--validation", model, limit=None)
        return ((loaded.x, loaded.y) if loaded.sample_weight is None
                else (loaded.x, loaded.y, loaded.sample_weight))
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


def as_float32(x):
    """Inputs as Keras trains on them: float64 becomes float32 once, here, not per batch;
    other dtypes (integer token ids, float16) stay as they are. `x` may be nested (several
    inputs)."""
    return map_nested(lambda a: a.astype(np.float32) if getattr(a, "dtype", None) == np.float64
                      else a, x)


def map_nested(fn, data):
    """`fn` applied to every array of a nested structure of lists, tuples and dicts (the
    structures Keras takes for several inputs or outputs); an array alone is a leaf."""
    if isinstance(data, dict):
        return {k: map_nested(fn, v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(map_nested(fn, v) for v in data)
    return fn(data)


def leaves(data) -> list:
    """The arrays of a nested structure, in order (dicts by key order, as given)."""
    if isinstance(data, dict):
        return [leaf for v in data.values() for leaf in leaves(v)]
    if isinstance(data, (list, tuple)):
        return [leaf for v in data for leaf in leaves(v)]
    return [data]


def take(data, index):
    """`data[index]` for an array or a nested structure of arrays (None stays None)."""
    if data is None:
        return None
    return map_nested(lambda a: a[index], data)


def num_rows(data) -> int:
    """The number of samples in an array or a nested structure of arrays (the first leaf's)."""
    return len(leaves(data)[0])


class SampleSource(Protocol):
    """What the training loops read batches from: `ArraySource` (arrays in memory) or
    `ShardStream` (this worker's shard of a streamed dataset). `in_memory`: the arrays are
    there (`x`, `y`, `sample_weight`, `num_samples`, `indices`), so a compiled step may hold
    them and gather each batch itself."""

    in_memory: bool

    def batch(self, epoch: int, start: int, stop: int) -> tuple: ...

    def head(self, n: int) -> tuple: ...


class ArraySource:
    """Batches from arrays (nested for several inputs or outputs, with optional per-sample
    weights): positions `[start, stop)` of an epoch.

    An epoch is `epoch_size` samples of a stream of passes over the data, each pass in its
    own order (`epoch_permutation(n, seed, pass)`, or the data's order with `shuffle=False`).
    With `epoch_size` = the number of samples (the default) an epoch is one pass, as in `fit`;
    smaller (`fit(steps_per_epoch=...)`), an epoch is part of a pass and the next epoch goes
    on where it stopped, as Keras's epoch iterator does.

    Example:
        >>> src = ArraySource(np.arange(4.0), np.arange(4), 4, seed=0, shuffle=False, epoch_size=3)
        >>> src.indices(0, 0, 3).tolist(), src.indices(1, 0, 3).tolist()
        ([0, 1, 2], [3, 0, 1])
    """

    in_memory = True

    def __init__(self, x, y, num_samples: int, seed: int, sample_weight=None, *,
                 shuffle: bool = True, epoch_size: int | None = None):
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.num_samples, self.seed, self.shuffle = num_samples, seed, shuffle
        self.epoch_size = epoch_size or num_samples
        self._orders: dict[int, np.ndarray] = {}

    def batch(self, epoch: int, start: int, stop: int) -> tuple:
        """(x, y) of the positions, or (x, y, sample_weight) when the data has weights."""
        index = self.indices(epoch, start, stop)
        batch = (take(self.x, index), take(self.y, index))
        return batch if self.sample_weight is None else (*batch, take(self.sample_weight, index))

    def indices(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """The samples of `batch(epoch, start, stop)`, as indices into the arrays (int64)."""
        first = epoch * self.epoch_size + start
        passes, offsets = divmod(np.arange(first, first + (stop - start), dtype=np.int64),
                                 self.num_samples)
        if passes.size and passes[0] == passes[-1]:  # the usual case: within one pass
            return self._order(int(passes[0]))[offsets]
        return np.concatenate([self._order(int(p))[offsets[passes == p]]
                               for p in np.unique(passes)])

    def _order(self, n_pass: int) -> np.ndarray:
        order = self._orders.get(n_pass)
        if order is None:
            if self.shuffle:
                order = epoch_permutation(self.num_samples, self.seed, n_pass)
            else:
                order = np.arange(self.num_samples, dtype=np.int64)
            if len(self._orders) >= 2:  # workers read one pass, and at its end the next
                del self._orders[min(self._orders)]
            self._orders[n_pass] = order
        return order

    def head(self, n: int) -> tuple:
        """The first `n` samples, shaped as `batch` returns them."""
        batch = (take(self.x, slice(0, n)), take(self.y, slice(0, n)))
        return (batch if self.sample_weight is None
                else (*batch, take(self.sample_weight, slice(0, n))))


class ShardStream:
    """Batches from this worker's shard of a streamed dataset: only a chunk's size matters
    (`stop - start` samples, in the shard's order); at its end the shard starts a new pass."""

    in_memory = False

    def __init__(self, dataset, num_workers: int, worker: int, read_batch: int = READ_BATCH):
        self.worker, self.num_workers = worker, num_workers
        self.dataset = dataset.shard(num_workers, worker).batch(read_batch)
        self._iter = None
        self._buffer: list[tuple] = []
        self._buffered = 0
        self.passes = 0  # passes over the shard begun

    def batch(self, epoch: int, start: int, stop: int) -> tuple:
        return self.take(stop - start)

    def take(self, n: int) -> tuple:
        """The next `n` samples of the shard: (x, y[, sample_weight]), x and y nested or not."""
        if n <= 0:
            return self.head(0)
        fresh = False
        while self._buffered < n:
            if self._iter is None:
                self._iter, self.passes, fresh = (self.dataset.as_numpy_iterator(),
                                                  self.passes + 1, True)
            part = next(self._iter, None)
            if part is None:
                if fresh:
                    self.head(1)  # raises: the shard is empty
                self._iter = None
                continue
            fresh = False
            self._buffer.append((as_float32(part[0]), *part[1:]))
            self._buffered += num_rows(part[0])
        whole = concat(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
        left = num_rows(whole[0]) - n
        self._buffer = [tuple(take(p, slice(n, None)) for p in whole)] if left > 0 else []
        self._buffered = left
        return tuple(take(p, slice(0, n)) for p in whole)

    def head(self, n: int) -> tuple:
        """The shard's first `n` samples (or fewer), without moving the stream."""
        first = next(self.dataset.unbatch().batch(max(n, 1)).as_numpy_iterator(), None)
        if first is None:
            raise DataError(f"Worker {self.worker}'s shard of the streamed data is empty (1 of "
                            f"every {self.num_workers} samples). Use fewer workers or more data.")
        return tuple(take(p, slice(0, n)) for p in first)
