"""The compiled update kernel gives NumPy's numbers bit for bit, and refuses what it cannot do.

Bit-identical is the design (the kernel rounds `g * lr` to float32 and then subtracts, as NumPy
does, with no fused multiply-add), so every comparison here is on the float32 bit patterns.
"""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from nbdist.algorithms import kernels
from nbdist.algorithms.kernels import copy_out, sgd_step_and_copy_numpy, sgd_step_numpy

try:
    import nbdist._kernels as compiled
except ImportError as exc:  # a source checkout without `pip install -e .`
    compiled, missing = None, str(exc)
else:
    missing = ""

needs_compiled = pytest.mark.skipif(compiled is None, reason=f"nbdist._kernels is not built: {missing}")

SPECIAL = np.array([0x00000000, 0x80000000,  # +0, -0
                    0x00000001, 0x80000001, 0x007FFFFF, 0x00400000,  # denormals
                    0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,  # smallest normal, ±largest
                    0x7F800000, 0xFF800000,  # ±inf
                    0x7FC00000, 0xFFC00000, 0x7FC12345, 0xFFC00001, 0x7FA00001,  # NaNs (one signalling)
                    0x3F800000, 0xBF800000], np.uint32).view(np.float32)
SIZES = (0, 1, 3, 17, (1 << 21) + 5)
LRS = (0.01, 1e-3, 0.0, -0.0, 3.5, 1e-40, 1e38, float("inf"), np.float32(0.1))


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Normal values with about a quarter replaced by the special ones."""
    x = rng.normal(scale=rng.choice([1e-3, 1.0, 1e3]), size=n).astype(np.float32)
    pick = rng.random(n) < 0.25
    x[pick] = rng.choice(SPECIAL, size=int(pick.sum()))
    return x


def _at(x: np.ndarray, offset: int) -> np.ndarray:
    """`x` copied into a buffer that starts `offset` floats past an allocation's start."""
    base = np.empty(x.size + offset, np.float32)
    view = base[offset:]
    view[:] = x
    return view


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32)


def _same_numbers(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, except which NaN: where two NaNs meet in an addition or a multiplication,
    IEEE 754 leaves which one comes out to the hardware and the operand order the compiler
    (or NumPy's loop) chose. A NaN must still be a NaN on both sides."""
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(_bits(a)[~nan], _bits(b)[~nan]))


@needs_compiled
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("n", SIZES)
def test_sgd_step_copy_is_numpy_bit_for_bit(n, stream):
    rng = np.random.default_rng(n)
    w0, g0 = _values(rng, n), _values(rng, n)
    for w_off, out_off in [(0, 0), (1, 0), (0, 1), (2, 3), (3, 2)]:
        lr = LRS[(w_off + 2 * out_off) % len(LRS)]
        w, g, out = _at(w0, w_off), _at(g0, (w_off + 1) % 4), _at(np.zeros(n, np.float32), out_off)
        expected_w, expected_out = w0.copy(), np.zeros(n, np.float32)
        with np.errstate(all="ignore"):
            sgd_step_and_copy_numpy(expected_w, g0, lr, np.empty(n, np.float32), expected_out)
        compiled.sgd_step_copy(w, g, lr, out, stream)
        assert np.array_equal(_bits(w), _bits(expected_w)), (w_off, out_off, lr)
        assert np.array_equal(_bits(out), _bits(expected_out)), (w_off, out_off, lr)


@needs_compiled
@pytest.mark.parametrize("n", SIZES)
def test_sgd_step_and_copy_stream_are_numpy_bit_for_bit(n):
    rng = np.random.default_rng(100 + n)
    w0, g0 = _values(rng, n), _values(rng, n)
    for lr in LRS:
        w, expected = _at(w0, 3), w0.copy()
        with np.errstate(all="ignore"):
            sgd_step_numpy(expected, g0, lr, np.empty(n, np.float32))
        compiled.sgd_step(w, _at(g0, 1), lr)
        assert np.array_equal(_bits(w), _bits(expected)), lr
    for off in range(4):
        dst = _at(np.zeros(n, np.float32), off)
        compiled.copy_stream(dst, w0)
        assert np.array_equal(_bits(dst), _bits(w0)), off


@needs_compiled
def test_a_step_on_w_with_itself_as_the_gradient_is_numpy_s():
    w0 = _values(np.random.default_rng(7), 1000)
    w, out, expected = w0.copy(), np.empty(1000, np.float32), w0.copy()
    with np.errstate(all="ignore"):
        sgd_step_and_copy_numpy(expected, expected, 0.5, np.empty(1000, np.float32), expected.copy())
    compiled.sgd_step_copy(w, w, 0.5, out)
    assert np.array_equal(_bits(w), _bits(expected)) and np.array_equal(_bits(out), _bits(expected))


@needs_compiled
@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda w, g, o: compiled.sgd_step_copy(w.astype(np.float64), g, 0.1, o), TypeError, "w must hold float32"),
    (lambda w, g, o: compiled.sgd_step_copy(w, g.astype(np.int32), 0.1, o), TypeError, "g must hold float32"),
    (lambda w, g, o: compiled.sgd_step_copy(w, g, 0.1, o[::2][:4]), TypeError, "C-contiguous"),
    (lambda w, g, o: compiled.sgd_step_copy(w, g, 0.1, bytes(32)), TypeError, "writable"),
    (lambda w, g, o: compiled.sgd_step_copy(w, g[:7], 0.1, o), ValueError, "Received: 8 and 7"),
    (lambda w, g, o: compiled.sgd_step_copy(w, g, 0.1, w), ValueError, "overlap"),
    (lambda w, g, o: compiled.sgd_step_copy(w, g, "0.1", o), TypeError, "lr must be a real number"),
    (lambda w, g, o: compiled.sgd_step(w, g[1:], 0.1), ValueError, "same number of floats"),
    (lambda w, g, o: compiled.copy_stream(o[1:], o[:-1]), ValueError, "overlap"),
    (lambda w, g, o: compiled.sgd_step_copy(w, g, 0.1), TypeError, "takes 4 or 5"),
])
def test_wrong_arguments_are_refused_with_what_was_expected(call, error, words):
    w, g, o = np.ones(8, np.float32), np.ones(8, np.float32), np.zeros(8, np.float32)
    readonly = np.ones(8, np.float32)
    readonly.setflags(write=False)
    with pytest.raises(error, match=words):
        call(w, g, o)
    with pytest.raises(TypeError, match="writable"):
        compiled.sgd_step(readonly, g, 0.1)
    assert w.tolist() == [1.0] * 8 and o.tolist() == [0.0] * 8  # nothing written on refusal


def test_the_dispatch_gives_numpy_s_numbers_on_other_dtypes_too():
    w = np.array([1.0, 2.0])  # float64: always NumPy's path
    kernels.sgd_step(w, np.array([0.5, 1.0]), 0.5, None)
    out = np.empty(2, np.float32)
    copy_out(out, np.array([1.5, -2.0], np.float32), stream=True)
    assert w.tolist() == [0.75, 1.5] and out.tolist() == [1.5, -2.0]


def test_the_compiled_kernel_is_built_where_it_must_be():
    """Under CI the package is installed with `pip install -e .`, which builds the kernel: a
    silent fallback to NumPy would hide a 2x slower hub."""
    if compiled is None:
        assert os.environ.get("CI") != "true", f"nbdist._kernels was not built: {missing}"
        pytest.skip(f"nbdist._kernels is not built here: {missing}")
    assert kernels.COMPILED is compiled or os.environ.get("NBDIST_KERNELS") == "0"


def test_nbdist_kernels_0_chooses_numpy():
    code = "import nbdist.algorithms.kernels as k; print(k.IMPLEMENTATION, k.COMPILED)"
    env = {**os.environ, "NBDIST_KERNELS": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "numpy (NBDIST_KERNELS=0) None"


def test_a_kernel_that_does_not_import_falls_back_to_numpy_with_a_warning(monkeypatch, caplog):
    monkeypatch.delenv("NBDIST_KERNELS", raising=False)
    monkeypatch.setitem(sys.modules, "nbdist._kernels", None)  # import raises ImportError
    with caplog.at_level(logging.WARNING, logger="nbdist.algorithms.kernels"):
        module, name = kernels._load()  # noqa: SLF001 - the loader, which runs once at import
    assert module is None and name == "numpy (the compiled kernel did not load)"
    assert "Reinstall nbdist" in caplog.text and "NBDIST_KERNELS=0" in caplog.text


@pytest.mark.parametrize("name", ["asgd", "dc-asgd"])  # the fused kernel; a step then a copy-out
def test_a_rule_s_push_and_read_past_the_cache_is_numpy_s_across_blocks(name):
    from nbdist.algorithms import make_rule
    from nbdist.algorithms.blocks import block_ranges, run_serial

    size = kernels.STREAM_MIN + 5  # streaming stores, two blocks, a ragged tail
    rng = np.random.default_rng(1)
    w0, g = _values(rng, size), _values(rng, size)
    rule, plain = make_rule(name, size, 1), make_rule(name, size, 1)
    if name == "asgd":
        rule.use_blocks(run_serial, block_ranges(size, 2))
    w, expected, out = w0.copy(), w0.copy(), _at(np.zeros(size, np.float32), 1)
    rule.on_pull(0, w, 0)
    plain.on_pull(0, expected, 0)
    with np.errstate(all="ignore"):
        assert rule.push_and_read(0, w, g, 0.1, 0, out)
        if name == "asgd":  # NumPy's fused pass
            sgd_step_and_copy_numpy(expected, g, 0.1, np.empty(size, np.float32), np.empty(size, np.float32))
        else:  # NumPy's step, then a copy
            plain.on_push(0, expected, g, 0.1, 0)
    assert np.array_equal(_bits(w), _bits(expected)) and np.array_equal(_bits(out), _bits(expected))


FORMULA_CASES = [("Adam", {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "amsgrad": False}),
                 ("Adam", {"beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-3, "amsgrad": False}),
                 ("SGD", {"momentum": 0.9, "nesterov": False}),
                 ("SGD", {"momentum": 0.5, "nesterov": True}),
                 ("SGD", {"momentum": 0.0, "nesterov": False})]


@needs_compiled
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(("name", "config"), FORMULA_CASES)
def test_the_compiled_formulas_are_numpy_s_bit_for_bit(name, config, n, monkeypatch):
    from nbdist.algorithms.optimizer_rules import FORMULAS

    def formula():
        return FORMULAS[name](config, n, (np.empty(n, np.float32), np.empty(n, np.float32)))

    rng = np.random.default_rng(n + len(config))
    compiled_f, numpy_f = formula(), formula()
    w0 = _values(rng, n)
    w, expected = _at(w0, 1), w0.copy()
    for step, lr in enumerate([np.float32(0.01), np.float32(0.5), np.float32(1e-30), np.float32(3.0)]):
        g = _at(_values(rng, n), step % 4)
        with np.errstate(all="ignore"):
            compiled_f.apply(w, g, lr, step)
            monkeypatch.setattr(kernels, "COMPILED", None)
            numpy_f.apply(expected, g, lr, step)
            monkeypatch.undo()
        assert _same_numbers(w, expected), (step, "w")
        for slot, value in numpy_f.slots.items():
            assert _same_numbers(compiled_f.slots[slot], value), (step, slot)


@needs_compiled
def test_the_formula_kernels_refuse_overlapping_slots():
    w, g, m = np.ones(8, np.float32), np.ones(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="m and v overlap"):
        compiled.adam_step(w, g, m, m, 0.1, 0.1, 0.001, 1e-7)
    with pytest.raises(TypeError, match="momentum must be a real number"):
        compiled.momentum_step(w, g, m, 0.1, None, False)
    assert w.tolist() == [1.0] * 8 and m.tolist() == [0.0] * 8
