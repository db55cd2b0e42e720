"""Reading a cell's data: arrays, tf.data datasets and generator functions, in memory or
streamed by shards. Small datasets with known values; no cluster."""

import numpy as np
import pytest

from nbdist.engine.data import (
    ArraySource,
    ShardStream,
    data_adapter,
    format_size,
    is_batched,
    load,
)
from nbdist.errors import DataError


def _dataset(n=10, batch=None):
    import tensorflow as tf

    # row i is (i, i, i)
    x = np.arange(n, dtype="float32").reshape(n, 1) * np.ones((1, 3), "float32")
    ds = tf.data.Dataset.from_tensor_slices((x, np.arange(n, dtype="int64")))
    return ds.batch(batch) if batch else ds


class _Model:  # what `load` reads of a model: its declared input (rank 2 with the batch)
    def __init__(self, rank=2):
        self.inputs = [np.zeros((1,) * rank)] if rank else None


def test_the_adapters_tell_arrays_datasets_loaders_and_generator_functions_apart():
    import torch

    def gen():
        yield np.zeros((2, 3)), np.zeros(2)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 3)))
    kinds = [data_adapter(v).name for v in (np.zeros(3), _dataset(), _dataset(batch=2).repeat(),
                                            loader, gen, gen(), 5)]
    assert kinds == ["array", "tf.data.Dataset", "tf.data.Dataset", "torch DataLoader",
                     "generator", "iterator", "other"]
    assert [data_adapter(d).infinite() for d in (_dataset(), _dataset().repeat())] == [False, True]


@pytest.mark.parametrize("shape,rank,default,batched", [
    ((None, 28, 28), 3, False, True),  # rank of the model's input: batches
    ((28, 28), 3, True, False),  # one dimension fewer: samples, whatever the default
    ((None, 10), None, False, True),  # model silent: `.batch()` leaves the first dimension unknown
    ((32, 10), None, False, False),  # model silent, fixed first dimension: the default
    ((32, 10), None, True, True),
])
def test_is_batched_follows_the_model_then_the_unknown_leading_dimension(shape, rank, default,
                                                                          batched):
    assert is_batched(shape, rank, default) is batched


@pytest.mark.parametrize("batch", [None, 3, 4])
def test_small_dataset_is_read_into_the_same_arrays_batched_or_not(batch):
    loaded = load(_dataset(10, batch), "ds", "--data", _Model(), limit=2**30)
    assert not loaded.streamed and loaded.num_samples == 10
    assert loaded.x.shape == (10, 3) and loaded.x[:, 0].tolist() == list(range(10))
    assert loaded.y.tolist() == list(range(10))
    assert loaded.head[1].tolist() == [0, 1]


def test_generator_function_yields_batches_like_model_fit_expects():
    def batches():
        for start in (0, 4, 8):
            stop = min(start + 4, 10)
            yield np.full((stop - start, 3), start, "float32"), np.arange(start, stop)

    loaded = load(batches, "batches", "--data", _Model(), limit=None)
    assert loaded.num_samples == 10 and loaded.y.tolist() == list(range(10))
    assert loaded.x[:, 0].tolist() == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8]


def test_generator_of_single_samples_is_recognised_by_the_model_rank():
    def samples():
        for i in range(5):
            yield np.full(3, i, "float32"), i

    loaded = load(samples, "samples", "--data", _Model(), limit=None)
    assert loaded.x.shape == (5, 3) and loaded.y.tolist() == [0, 1, 2, 3, 4]


def test_dataset_beyond_the_limit_is_counted_and_streamed():
    # 10 samples of 3 float32 + 1 int64 = 20 bytes each; batches of 4 = 80 bytes
    loaded = load(_dataset(10, 4), "ds", "--data", _Model(), limit=100)
    assert loaded.streamed and loaded.num_samples == 10 and loaded.x is None
    assert loaded.head[1].tolist() == [0, 1]
    # exactly 200 bytes fit
    assert not load(_dataset(10, 4), "ds", "--data", _Model(), limit=200).streamed


def test_limit_zero_always_streams_and_engines_need_no_count():
    loaded = load(_dataset(10), "ds", "--data", _Model(), limit=0, count=False)
    assert loaded.streamed and loaded.num_samples is None


def test_infinite_dataset_is_refused_with_how_to_fix():
    with pytest.raises(DataError, match=r"--data ds is infinite.*Drop \.repeat\(\).*ds\.take\(n\)"):
        load(_dataset(10, 4).repeat(), "ds", "--data", _Model(), limit=None)
    # batches of 4, 4, 2 (the end of a pass), 4, 4
    assert load(_dataset(10, 4).repeat().take(5), "ds", "--data", _Model(),
                limit=None).num_samples == 18


def test_dataset_of_triples_and_dicts_loads_with_weights_and_nested_inputs():
    import tensorflow as tf

    triples = tf.data.Dataset.from_tensor_slices((np.zeros((4, 3)), np.zeros(4), np.arange(4.0)))
    loaded = load(triples, "ds", "--data", _Model(), limit=None)
    assert loaded.num_samples == 4 and loaded.sample_weight.tolist() == [0.0, 1.0, 2.0, 3.0]
    dicts = tf.data.Dataset.from_tensor_slices(({"a": np.zeros((4, 3)), "b": np.ones((4, 2))},
                                                np.zeros(4)))
    loaded = load(dicts, "ds", "--data", _Model(), limit=None)
    assert loaded.x["b"].shape == (4, 2) and loaded.head[0]["a"].shape == (2, 3)
    singles = tf.data.Dataset.from_tensor_slices(np.zeros((4, 3)))
    with pytest.raises(DataError, match=r"expected \(features, labels\) pairs.*map"):
        load(singles, "ds", "--data", _Model(), limit=None)


def test_empty_dataset_is_refused():
    with pytest.raises(DataError, match="yields no samples"):
        load(_dataset(10, 4).take(0), "ds", "--data", _Model(), limit=None)


def test_shard_stream_cuts_the_shard_into_the_sizes_asked_and_starts_a_new_pass():
    # shard: 1, 3, 5, 7, 9
    stream = ShardStream(_dataset(10), num_workers=2, worker=1, read_batch=2)
    assert stream.take(3)[1].tolist() == [1, 3, 5]
    x, y = stream.take(4)
    assert y.tolist() == [7, 9, 1, 3] and x[:, 0].tolist() == [7, 9, 1, 3] and stream.passes == 2
    assert stream.batch(0, 100, 101)[1].tolist() == [5]  # a chunk gives only its size
    assert stream.head(2)[1].tolist() == [1, 3] and stream.take(1)[1].tolist() == [7]


def test_empty_shard_says_to_use_fewer_workers():
    with pytest.raises(DataError, match="shard of the streamed data is empty.*fewer workers"):
        ShardStream(_dataset(2), num_workers=3, worker=2).take(1)


def test_array_source_reads_the_epoch_permutation():
    from nbdist.core.schedule import epoch_permutation

    x, y = np.arange(20).reshape(10, 2), np.arange(10)
    source = ArraySource(x, y, 10, seed=3)
    order = epoch_permutation(10, 3, 1)
    assert source.batch(1, 2, 5)[1].tolist() == order[2:5].tolist()
    assert source.head(2)[1].tolist() == [0, 1]


def test_format_size():
    assert ([format_size(n) for n in (2 * 2**30, 1536, 3 * 2**20, 12)]
            == ["2GiB", "1.5KiB", "3MiB", "12B"])


def test_empty_shard_is_reported_by_head_too():
    with pytest.raises(DataError, match="Worker 2's shard of the streamed data is empty"):
        ShardStream(_dataset(2), num_workers=3, worker=2).head(2)
