"""--compression fp16: exact wire format (pure), then its effect on accuracy in real runs."""

import numpy as np
import pytest

import nbdist
from nbdist.config import TrainConfig
from nbdist.core.compression import FP16_MAX, decode, decode_into, encode, wire_bytes
from nbdist.errors import ConfigError
from tests.conftest import SYNTHETIC_CELL


def test_fp16_halves_the_bytes_and_rounds_to_eleven_significant_bits():
    values = np.array([0.1, -2.5, 1e-3, 3.0e4], dtype=np.float32)
    wire = encode(values, "fp16")
    assert wire.dtype == np.dtype("<f2") and wire.nbytes == values.nbytes // 2 == wire_bytes(4, "fp16")
    back = decode(wire.tobytes(), "fp16")
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, values, rtol=2 ** -11)
    assert back[1] == -2.5  # exactly representable values survive exactly


def test_fp16_saturates_instead_of_overflowing_to_inf():
    wire = encode(np.array([1e9, -1e9, np.float32(7e4)], dtype=np.float32), "fp16")
    assert decode(wire.tobytes(), "fp16").tolist() == [FP16_MAX, -FP16_MAX, FP16_MAX]


def test_none_sends_the_float32_array_itself_and_decode_into_writes_in_place():
    values = np.arange(5, dtype=np.float32)
    assert encode(values, "none") is values
    out = np.zeros(5, dtype=np.float32)
    decode_into(encode(values, "fp16").tobytes(), "fp16", out)
    np.testing.assert_array_equal(out, values)
    decode_into(values.tobytes(), "none", out)
    np.testing.assert_array_equal(out, values)


def test_unknown_compression_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="--compression"):
        TrainConfig(compression="int8")


@pytest.mark.cluster
def test_fp16_transfer_costs_little_accuracy_on_the_hub_weights(cluster):
    """TCP transport (as across hosts): the same seed with float32 and with float16 on the wire."""
    accuracies = {}
    for mode in ("none", "fp16"):
        ns = {}
        run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, workers=2, epochs=3,
                           batch_size=16, transport="tcp", compression=mode, wait=True)
        assert run.status == "finished"
        accuracies[mode] = ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1]
    assert accuracies["none"] > 0.9
    assert abs(accuracies["fp16"] - accuracies["none"]) <= 0.03, accuracies


@pytest.mark.cluster
@pytest.mark.horovod
def test_sync_fp16_allreduce_keeps_ranks_identical_and_accuracy(cluster):
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, mode="sync", workers=2, epochs=2,
                       batch_size=32, compression="fp16", wait=True)
    results = run._backend.results  # noqa: SLF001
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.9
