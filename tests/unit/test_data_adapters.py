"""The data adapters: one kind of data per adapter, chosen once by `data_adapter`, without
importing TensorFlow or PyTorch (their classes are told by name and module, so stand-ins with
those names are enough here; tests/inproc/test_data.py checks the real ones)."""

import numpy as np
import pytest

from nbdist.engine.data import (
    ADAPTERS,
    ArrayAdapter,
    DataAdapter,
    GeneratorFunctionAdapter,
    IteratorAdapter,
    OtherAdapter,
    PyDatasetAdapter,
    TFDatasetAdapter,
    TorchDataLoaderAdapter,
    data_adapter,
)


def _stand_in(name: str, module: str, **members) -> type:
    """A class named and placed as a library's, as the chooser sees it."""
    return type(name, (), {"__module__": module, **members})


DatasetV2 = _stand_in("DatasetV2", "tensorflow.python.data.ops.dataset_ops",
                      __iter__=lambda self: iter(()), __len__=lambda self: 0, shape=None)
TensorSliceDataset = type("TensorSliceDataset", (DatasetV2,), {"__module__": "tensorflow.x"})
DataLoader = _stand_in("DataLoader", "torch.utils.data.dataloader",
                       __iter__=lambda self: iter(()), __len__=lambda self: 0)
PyDataset = _stand_in("PyDataset", "keras.src.trainers.data_adapters.py_dataset_adapter",
                      __len__=lambda self: 3, __getitem__=lambda self, i: (i, i))
NotTorch = _stand_in("DataLoader", "mylib.loaders")


def _gen():
    yield np.zeros((2, 3)), np.zeros(2)


@pytest.mark.parametrize("value,kind", [
    (np.zeros(3), ArrayAdapter),
    (TensorSliceDataset(), TFDatasetAdapter),  # a subclass, as every concrete tf.data class is
    (DataLoader(), TorchDataLoaderAdapter),
    (_gen, GeneratorFunctionAdapter),
    (_gen(), IteratorAdapter),
    (iter([1, 2]), IteratorAdapter),
    (PyDataset(), PyDatasetAdapter),
    (NotTorch(), OtherAdapter),  # the name alone is not enough: the module counts too
    (5, OtherAdapter),
    (None, OtherAdapter),
    ([np.zeros(3)], OtherAdapter),  # a list of arrays is several names' work, not one array
])
def test_each_kind_of_data_gets_its_own_adapter_wrapping_the_value(value, kind):
    adapter = data_adapter(value)
    assert type(adapter) is kind and adapter.value is value


def test_an_adapter_is_chosen_once_and_handed_back_as_it_is():
    adapter = data_adapter(np.zeros(3))
    assert data_adapter(adapter) is adapter


def test_the_first_kind_that_handles_a_value_wins_and_the_last_handles_anything():
    """A tf.data.Dataset also has a length and a shape here: it is still a dataset."""
    assert ADAPTERS[-1] is OtherAdapter and all(issubclass(k, DataAdapter) for k in ADAPTERS)
    assert ArrayAdapter.handles(DatasetV2()) and type(data_adapter(DatasetV2())) is TFDatasetAdapter


def test_what_each_kind_may_do():
    table = {k.__name__: (k.name, k.streams, k.ships, k.replayed) for k in ADAPTERS}
    assert table == {
        "TFDatasetAdapter": ("tf.data.Dataset", True, False, False),
        "TorchDataLoaderAdapter": ("torch DataLoader", True, True, False),
        "GeneratorFunctionAdapter": ("generator", True, True, False),
        "PyDatasetAdapter": ("PyDataset", False, True, True),
        "IteratorAdapter": ("iterator", False, True, True),
        "ArrayAdapter": ("array", False, True, False),
        "OtherAdapter": ("other", False, True, False),
    }


def test_replayed_kinds_give_an_epochs_batches_bounded_by_steps():
    assert list(data_adapter(PyDataset()).batches(None)) == [(0, 0), (1, 1), (2, 2)]
    assert list(data_adapter(PyDataset()).batches(2)) == [(0, 0), (1, 1)]
    assert list(data_adapter(iter(range(5))).batches(2)) == [0, 1]
    assert list(data_adapter(iter(range(3))).batches(None)) == [0, 1, 2]


def test_a_kind_asked_for_what_it_cannot_do_says_so():
    adapter = data_adapter(np.zeros(3))
    assert adapter.infinite() is False
    with pytest.raises(TypeError, match="ArrayAdapter does not stream"):
        adapter.batched("x", "--data", None)
    with pytest.raises(TypeError, match="ArrayAdapter is not replayed"):
        adapter.batches(None)
