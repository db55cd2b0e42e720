"""--compression powersgd:RANK: its frames against a NumPy reference written step by step
(Gram-Schmidt instead of QR), its error feedback, and where it finds the matrices of a slice."""

import numpy as np
import pytest

from nbdist.config import TrainConfig
from nbdist.core.compression import PushEncoder, decode, decode_into, encode, parse, wire_bytes
from nbdist.core.low_rank import LowRankSender, frame_floats, matrices_in
from nbdist.errors import ConfigError

SHAPES = [(12, 8), (8,), (8, 3), (3,)]  # two kernels (the second dense from rank 3), biases
COUNT = 12 * 8 + 8 + 8 * 3 + 3


def reference_round(m: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One PowerSGD round by hand, in float64: P = M Q, Gram-Schmidt on P's columns, Q = M^T P."""
    p = m @ q
    for j in range(p.shape[1]):
        for i in range(j):
            p[:, j] -= (p[:, i] @ p[:, j]) * p[:, i]
        p[:, j] /= np.linalg.norm(p[:, j])
    return p, m.T @ p


def test_the_matrices_are_the_weights_their_factors_make_smaller_and_lie_whole_in_the_slice():
    assert matrices_in(SHAPES, 0, COUNT, 3) == ((0, 12, 8),)  # (8 + 3) 3 = 33 >= 24: dense
    assert matrices_in(SHAPES, 0, COUNT, 2) == ((0, 12, 8), (104, 8, 3))  # 22 < 24
    assert matrices_in(SHAPES, 104, COUNT, 1) == ((0, 8, 3),)  # relative to the slice
    assert matrices_in(SHAPES, 50, COUNT, 1) == ((54, 8, 3),)  # the first is cut: dense
    assert matrices_in([(3, 3, 4, 16)], 0, 576, 4) == ((0, 36, 16),)  # a conv kernel (..., out)
    assert matrices_in(SHAPES, 0, COUNT, 8) == ()  # nothing to save at rank 8


def test_a_frame_is_each_matrixs_factors_then_the_other_floats_as_the_reference_computes():
    rng = np.random.default_rng(3)
    values = rng.normal(size=COUNT).astype(np.float32)
    codec = parse("powersgd:3").bind(SHAPES, 0, COUNT)
    q0 = np.random.default_rng(7).standard_normal((8, 3), dtype=np.float32)
    frame = encode(values, codec, np.random.default_rng(7)).view("<f4")
    p, q = reference_round(values[:96].reshape(12, 8).astype(np.float64), q0.astype(np.float64))
    got_p, got_q = frame[:36].reshape(12, 3), frame[36:60].reshape(8, 3)
    # the columns' signs are QR's choice; P Q^T, what the receiver gets, does not depend on them
    np.testing.assert_allclose(np.abs(got_p), np.abs(p), atol=1e-5)
    np.testing.assert_allclose(got_p @ got_q.T, p @ q.T, atol=1e-5)
    np.testing.assert_array_equal(frame[60:], values[96:])  # the others, exactly, in order
    assert frame.nbytes == wire_bytes(COUNT, codec) == 4 * (60 + COUNT - 96)
    decoded = decode(frame.view(np.uint8), codec, COUNT)
    np.testing.assert_allclose(decoded[:96].reshape(12, 8), p @ q.T, atol=1e-5)
    np.testing.assert_array_equal(decoded[96:], values[96:])


def test_a_matrix_of_rank_r_arrives_whole_at_rank_r():
    """At full rank the compressor is the identity: nothing of such a matrix is left out."""
    rng = np.random.default_rng(0)
    m = (rng.normal(size=(12, 3)) @ rng.normal(size=(3, 8))).astype(np.float32)
    values = np.concatenate([m.ravel(), rng.normal(size=COUNT - 96).astype(np.float32)])
    codec = parse("powersgd:3").bind(SHAPES, 0, COUNT)
    np.testing.assert_allclose(decode(encode(values, codec, rng), codec, COUNT), values,
                               atol=1e-4)


def test_each_sender_warm_starts_from_its_last_q_as_the_reference_does():
    rng = np.random.default_rng(5)
    sender = LowRankSender(((0, 12, 8),), 2, 96, np.random.default_rng(1))
    q = np.random.default_rng(1).standard_normal((8, 2), dtype=np.float32).astype(np.float64)
    for _ in range(3):
        m = rng.normal(size=(12, 8))
        frame = sender.encode(m.astype(np.float32).ravel()).view("<f4")
        p, q = reference_round(m, q)
        np.testing.assert_allclose(frame[:24].reshape(12, 2) @ frame[24:].reshape(8, 2).T,
                                   p @ q.T, atol=1e-4)
        q = frame[24:].reshape(8, 2).astype(np.float64)  # QR's signs, carried on as the sender does


def test_error_feedback_conserves_the_sum_of_the_gradients():
    """Sum of what was sent + what is left = sum of the gradients (float64), so nothing is lost."""
    rng = np.random.default_rng(2)
    codec = parse("powersgd:1").bind(SHAPES, 0, COUNT)
    push = PushEncoder(codec, COUNT, np.random.default_rng(4))
    sent, pushed = np.zeros(COUNT), np.zeros(COUNT)
    for _ in range(20):
        gradient = rng.normal(size=COUNT).astype(np.float32)
        pushed += gradient
        sent += decode(push.encode(gradient), codec, COUNT)
    np.testing.assert_allclose(sent + push.residual, pushed, atol=1e-4)
    assert np.abs(push.residual[96:104]).max() == 0  # a bias goes whole: nothing of it is left


def test_a_q_column_that_becomes_zero_is_drawn_again_so_that_the_matrix_is_sent_later():
    sender = LowRankSender(((0, 4, 4),), 1, 16, np.random.default_rng(0))
    sender.encode(np.zeros(16, np.float32))  # M^T P = 0: Q would be zero for ever after
    assert np.any(sender.q[0])
    m = np.outer([1, 2, 3, 4], [1, 0, 1, 0]).astype(np.float32).ravel()
    out = np.empty(16, np.float32)
    decode_into(sender.encode(m), parse("powersgd:1").bind([(4, 4)], 0, 16), out)
    np.testing.assert_allclose(out, m, atol=1e-5)


def test_each_shard_of_a_split_vector_finds_its_own_matrices_as_its_workers_do():
    bounds = [(0, 100), (100, COUNT)]  # the (12, 8) kernel on shard 0; (8, 3) cut? no: 104..128
    codecs = [parse("powersgd:1").bind(SHAPES, lo, hi) for lo, hi in bounds]
    assert [c.matrices for c in codecs] == [((0, 12, 8),), ((4, 8, 3),)]
    assert frame_floats(100, codecs[0].matrices, 1) == 20 + 4


def test_the_flag_takes_a_whole_rank_and_refuses_anything_else():
    assert TrainConfig(compression="PowerSGD:4").compression == "powersgd:4"
    for spec, says in (("powersgd", "needs its amount: powersgd:RANK"),
                       ("powersgd:0.5", "a whole number from 1 to 1024"),
                       ("powersgd:0", "a whole number from 1 to 1024")):
        with pytest.raises(ConfigError, match=says):
            TrainConfig(compression=spec)
    with pytest.raises(ConfigError, match="powersgd:2's two allreduces of its factors"):
        TrainConfig(mode="simulate", sim="sync=1", compression="powersgd:2")


def test_an_unbound_powersgd_codec_sends_everything_dense_and_pulls_go_as_int8():
    from nbdist.core.compression import pull_codec

    assert wire_bytes(COUNT, "powersgd:2") == 4 * COUNT
    assert pull_codec("powersgd:2") == parse("int8")


def test_a_frame_of_the_wrong_length_is_refused():
    codec = parse("powersgd:3").bind(SHAPES, 0, COUNT)
    with pytest.raises(ValueError, match="of 131 floats takes 380 bytes, this one 8"):
        decode(np.zeros(8, np.uint8), codec, COUNT)


def ranks_step(reducers, gradients, extras):
    """One sync step of every rank, the sums done by hand as the allreduce does them."""
    firsts = [r.first(g, e) for r, g, e in zip(reducers, gradients, extras, strict=True)]
    total = np.sum(firsts, axis=0)
    firsts = [total.copy() for _ in reducers]
    seconds = [r.second(f) for r, f in zip(reducers, firsts, strict=True)]
    q_total = np.sum(seconds, axis=0)
    return [r.finish(f, q_total.copy()) for r, f in zip(reducers, firsts, strict=True)]


def test_sync_powersgd_sums_p_then_q_over_the_ranks_as_the_papers_algorithm_does():
    """Vogels et al. 2019, Algorithm 1, by hand in float64 for 3 ranks and 2 steps: every rank
    gets the same P Q^T of the summed matrices and the summed biases; each keeps its own error."""
    from nbdist.core.low_rank import LowRankReducer

    matrices = matrices_in(SHAPES, 0, COUNT, 2)  # both kernels
    reducers = [LowRankReducer(matrices, 2, COUNT, seed=9) for _ in range(3)]
    rng = np.random.default_rng(9)  # the stream every rank draws its first Qs from
    q = [rng.standard_normal((cols, 2), dtype=np.float32).astype(np.float64)
         for _, _, cols in matrices]
    errors = [np.zeros(COUNT) for _ in range(3)]
    data = np.random.default_rng(1)
    for _ in range(2):
        gradients = [data.normal(size=COUNT).astype(np.float32) for _ in range(3)]
        extras = [np.array([float(i)], np.float32) for i in range(3)]
        results = ranks_step(reducers, gradients, extras)
        expected = np.zeros(COUNT)
        ms = [errors[i] + gradients[i] for i in range(3)]
        for j, (start, rows, cols) in enumerate(matrices):
            blocks = [m[start:start + rows * cols].reshape(rows, cols) for m in ms]
            p, _ = reference_round(sum(blocks), q[j])  # P = sum_i M_i Q, orthonormalised
            q_locals = [b.T @ p for b in blocks]
            q[j] = sum(q_locals)
            expected[start:start + rows * cols] = (p @ q[j].T).ravel()
            for i in range(3):
                errors[i][start:start + rows * cols] = (blocks[i] - p @ q_locals[i].T).ravel()
        others = np.setdiff1d(np.arange(COUNT), [i for s, r, c in matrices
                                                 for i in range(s, s + r * c)])
        expected[others] = sum(m[others] for m in ms)
        for i, (out, extra) in enumerate(results):
            np.testing.assert_allclose(out, expected, atol=1e-4)
            assert extra.tolist() == [3.0]  # 0 + 1 + 2: the control rides with P
            np.testing.assert_allclose(reducers[i].residual, errors[i], atol=1e-4)
        for j in range(len(matrices)):  # QR's column signs, carried on as the ranks do
            q[j] = reducers[0].q[j].astype(np.float64)
    np.testing.assert_array_equal(results[0][0], results[2][0])  # every rank the same


def test_sync_powersgd_error_feedback_conserves_the_sum_of_every_ranks_gradients():
    from nbdist.core.low_rank import LowRankReducer

    matrices = matrices_in(SHAPES, 0, COUNT, 1)
    reducers = [LowRankReducer(matrices, 1, COUNT, seed=3) for _ in range(2)]
    data = np.random.default_rng(0)
    applied, pushed = np.zeros(COUNT), np.zeros(COUNT)
    for _ in range(15):
        gradients = [data.normal(size=COUNT).astype(np.float32) for _ in range(2)]
        pushed += gradients[0].astype(np.float64) + gradients[1]
        (out, _), _ = ranks_step(reducers, gradients, [np.zeros(0, np.float32)] * 2)
        applied += out
    np.testing.assert_allclose(applied + reducers[0].residual + reducers[1].residual, pushed,
                               atol=1e-3)
