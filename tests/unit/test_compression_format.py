"""--compression fp16: the exact wire format (pure functions, exact values)."""

import numpy as np
import pytest

from nbdist.config import TrainConfig
from nbdist.core.compression import FP16_MAX, decode, decode_into, encode, wire_bytes
from nbdist.errors import ConfigError


def test_fp16_halves_the_bytes_and_rounds_to_eleven_significant_bits():
    values = np.array([0.1, -2.5, 1e-3, 3.0e4], dtype=np.float32)
    wire = encode(values, "fp16")
    assert (wire.dtype == np.dtype("<f2")
            and wire.nbytes == values.nbytes // 2 == wire_bytes(4, "fp16"))
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
