"""--compression: each codec's exact wire format against a plain NumPy reference written entry
by entry, error feedback, and the pull's copies that stay equal (pure functions, exact values)."""

import numpy as np
import pytest

from nbdist.config import TrainConfig
from nbdist.core.compression import (
    CHUNK,
    FP16_MAX,
    PullEncoder,
    PushEncoder,
    apply_pull,
    decode,
    decode_add,
    decode_into,
    encode,
    parse,
    wire_bytes,
)
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


def _reference_int8(values):
    """Chunk by chunk, entry by entry: q = rint(x / s), s = max|x| / 127."""
    scales, levels, decoded = [], [], []
    for start in range(0, values.size, CHUNK):
        chunk = values[start:start + CHUNK]
        scale = np.float32(max(abs(float(x)) for x in chunk)) / np.float32(127)
        scales.append(scale)
        for x in chunk:
            q = 0 if scale == 0 else int(np.rint(np.float32(x) / scale))
            levels.append(q)
            decoded.append(np.float32(q) * scale)
    return (np.array(scales, dtype="<f4").tobytes() + np.array(levels, dtype=np.int8).tobytes(),
            np.array(decoded, dtype=np.float32))


def test_int8_is_a_scale_per_chunk_and_a_byte_per_entry_exactly_as_the_reference():
    values = np.random.default_rng(1).normal(size=CHUNK * 2 + 77).astype(np.float32)
    values[CHUNK:2 * CHUNK] = 0  # an all-zero chunk: scale 0, every level 0
    frame = encode(values, "int8")
    expected_frame, expected = _reference_int8(values)
    assert frame.tobytes() == expected_frame
    assert frame.nbytes == wire_bytes(values.size, "int8") == values.size + 4 * 3
    np.testing.assert_array_equal(decode(frame, "int8", values.size), expected)
    np.testing.assert_allclose(expected, values, atol=np.abs(values).max() / 254 + 1e-7)


def _reference_qsgd(values, levels, unit):
    """l = floor(|x| / norm * s + u) per entry, sign kept; decoded l * norm / s."""
    norms, out_levels, decoded = [], [], []
    for start in range(0, values.size, CHUNK):
        chunk = np.zeros(CHUNK, dtype=np.float32)
        chunk[:values[start:start + CHUNK].size] = values[start:start + CHUNK]
        norm = np.sqrt(np.square(chunk).sum())
        norms.append(norm)
        for i, x in enumerate(values[start:start + CHUNK]):
            level = 0.0 if norm == 0 else np.floor(np.float32(abs(x)) / norm * np.float32(levels)
                                                   + unit[start // CHUNK, i])
            level = min(level, levels) * (-1 if x < 0 else 1)
            out_levels.append(level)
            decoded.append(np.float32(level) * (norm / np.float32(levels)))
    return (np.array(norms, dtype="<f4").tobytes() + np.array(out_levels, dtype=np.int8).tobytes(),
            np.array(decoded, dtype=np.float32))


def test_qsgd_draws_each_level_up_or_down_exactly_as_the_reference_given_the_same_stream():
    values = np.random.default_rng(2).normal(size=CHUNK + 100).astype(np.float32)
    frame = encode(values, "qsgd:4", np.random.default_rng(7))
    unit = np.random.default_rng(7).random((2, CHUNK), dtype=np.float32)
    expected_frame, expected = _reference_qsgd(values, 4, unit)
    assert frame.tobytes() == expected_frame
    np.testing.assert_array_equal(decode(frame, "qsgd:4", values.size), expected)
    assert set(np.unique(frame[8:].view(np.int8))) <= set(range(-4, 5))


def test_qsgd_is_unbiased_over_draws():
    values = np.random.default_rng(3).normal(size=300).astype(np.float32)
    rng = np.random.default_rng(0)
    mean = np.mean([decode(encode(values, "qsgd:2", rng), "qsgd:2", 300) for _ in range(4000)],
                   axis=0)
    # one draw is 0 or +-8.6 (the chunk's norm / 2) for entries of about 1: the mean of 4,000
    # has a spread of about 0.06 per entry, where rounding to the nearest level would be off by 1
    np.testing.assert_allclose(mean, values, atol=0.3)
    assert np.abs(mean - values).mean() < 0.06


def test_topk_keeps_the_largest_magnitudes_with_their_indices_ascending():
    values = np.array([0.5, -9.0, 3.0, 0.25, -4.0, 1.0, 2.0, -0.125], dtype=np.float32)
    frame = encode(values, "topk:0.375")  # k = ceil(0.375 * 8) = 3
    assert frame.nbytes == 24 == wire_bytes(8, "topk:0.375")
    assert frame[:12].view("<u4").tolist() == [1, 2, 4]
    assert frame[12:].view("<f4").tolist() == [-9.0, 3.0, -4.0]
    assert decode(frame, "topk:0.375", 8).tolist() == [0, -9, 3, 0, -4, 0, 0, 0]


def test_randomk_keeps_the_entries_the_stream_draws():
    values = np.arange(10, dtype=np.float32) + 1
    frame = encode(values, "randomk:0.2", np.random.default_rng(5))
    drawn = sorted(np.random.default_rng(5).choice(10, size=2, replace=False).tolist())
    assert frame[:8].view("<u4").tolist() == drawn
    assert frame[8:].view("<f4").tolist() == [values[i] for i in drawn]


def test_error_feedback_sends_what_an_earlier_push_left_out_later():
    push = PushEncoder("topk:0.25", 4)  # one entry a push
    sent = np.zeros(4, dtype=np.float32)
    for gradient in ([3.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]):
        decode_add(push.encode(np.array(gradient, dtype=np.float32)), "topk:0.25", sent)
    # pushes: 3 at 0; then 1 + 1 = 2 at 1; what is left after them is nothing
    assert sent.tolist() == [3.0, 2.0, 0.0, 0.0] and push.residual.tolist() == [0, 0, 0, 0]


def test_a_lossy_pull_keeps_the_hubs_and_the_workers_copies_equal_and_converges():
    rng = np.random.default_rng(4)
    weights = rng.normal(size=1200).astype(np.float32)
    worker_copy, worker_weights = np.zeros(1200, np.float32), np.empty(1200, np.float32)
    for codec in ("int8", "topk:0.1", "randomk:0.1"):
        pull = PullEncoder(codec, 1200, np.random.default_rng(9))
        worker_copy[:] = 0
        for _ in range(120):  # randomk: each entry is left out of all 120 with probability 3e-6
            apply_pull(pull.encode(weights).tobytes(), codec, worker_copy, worker_weights)
            np.testing.assert_array_equal(worker_copy, pull.held)
        np.testing.assert_allclose(worker_weights, weights, atol=0.02, err_msg=codec)


def test_qsgd_pulls_as_int8_changes_since_its_random_levels_would_not_converge():
    """QSGD's error can exceed the change it encodes (by sqrt(512) / s), so changes of changes
    grow: pulls take int8's deterministic levels, whose error is at most 1/254 of the chunk's."""
    assert PullEncoder("qsgd:4", 8).codec == parse("int8")


def test_a_frame_of_the_wrong_length_or_naming_an_entry_past_the_end_is_refused():
    with pytest.raises(ValueError, match="takes 16 bytes, this one 8"):
        decode_add(np.zeros(8, np.uint8), "topk:0.5", np.zeros(4, np.float32))
    frame = encode(np.arange(4, dtype=np.float32), "topk:0.5")
    frame[:8].view("<u4")[1] = 99
    with pytest.raises(ValueError, match="entry 99 of 4"):
        decode_add(frame, "topk:0.5", np.zeros(4, np.float32))


@pytest.mark.parametrize(("spec", "canonical"), [
    ("none", "none"), ("FP16", "fp16"), ("int8", "int8"), ("topk:0.01", "topk:0.01"),
    ("randomk:0.5", "randomk:0.5"), ("qsgd:16", "qsgd:16")])
def test_each_codec_is_a_value_of_the_flag(spec, canonical):
    assert str(parse(spec)) == canonical == TrainConfig(compression=spec).compression


@pytest.mark.parametrize(("spec", "says"), [
    ("zip", "Expected one of: none, fp16, int8, topk:RATIO"),
    ("topk", "needs its amount: topk:RATIO"),
    ("topk:2", "a number in \\(0, 1\\]"),
    ("qsgd:200", "from 1 to 127"),
    ("int8:4", "takes no amount")])
def test_a_wrong_codec_is_refused_with_what_to_pass(spec, says):
    with pytest.raises(ConfigError, match=says):
        TrainConfig(compression=spec)


@pytest.mark.parametrize("codec", ["fp16", "powersgd:2", "int8", "qsgd:4", "topk:0.01",
                                   "randomk:0.1"])
def test_sync_takes_every_codec_and_the_simulated_sync_all_but_powersgd(codec):
    assert TrainConfig(mode="sync", compression=codec).compression == codec
    if codec.startswith("powersgd"):
        with pytest.raises(ConfigError, match=f"but not --compression {codec}'s two "
                                              "allreduces.*train it in --mode sync"):
            TrainConfig(mode="simulate", sim="sync=1", compression=codec)
    else:
        config = TrainConfig(mode="simulate", workers=2, sim="sync=1", compression=codec)
        assert config.compression == codec


@pytest.mark.parametrize("codec", ["int8", "topk:0.5", "randomk:0.5", "qsgd:4"])
def test_an_empty_slice_is_an_empty_frame(codec):
    frame = encode(np.zeros(0, np.float32), codec, np.random.default_rng(0))
    assert frame.nbytes == wire_bytes(0, codec) == 0
    decode_add(frame, codec, np.zeros(0, np.float32))
