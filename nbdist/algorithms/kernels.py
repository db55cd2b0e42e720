"""The hub's memory-bound per-push passes: the compiled kernel if it is built, else NumPy.

At 10M+ parameters a push is bound by memory traffic. `nbdist._kernels` (C, built by
`pip install`) does SGD's step and the reply copy in one pass, with streaming stores for a reply
larger than the cache, which NumPy cannot issue; and Adam's and momentum's formulas in one pass
each instead of NumPy's 6-12. This module is the one place that decides
which is used: the compiled module when it imports and `NBDIST_KERNELS` is not `0`, else the
NumPy functions below, which give the same numbers bit for bit (tests/unit/test_kernels.py).
`IMPLEMENTATION` says which one, for the hub's statistics and the benchmarks.
"""

from __future__ import annotations

import logging
from types import ModuleType

import numpy as np

from nbdist.algorithms.blocks import BLOCK
from nbdist.env import switch

__all__ = ["COMPILED", "IMPLEMENTATION", "STREAM_MIN", "adam_step", "copy_out", "momentum_step",
           "sgd_step", "sgd_step_and_copy"]

_F32 = np.dtype(np.float32)

# floats from which a reply is written with streaming stores: a smaller one still sits in the
# cache when the worker or the MAC reads it (1M floats, update then read: 0.59 ms with ordinary
# stores, 1.05 with streaming; 4M: 3.85 vs 3.45; benchmarks/update_kernel.py)
STREAM_MIN = 1 << 21


def _load() -> tuple[ModuleType | None, str]:
    if not switch("NBDIST_KERNELS"):
        return None, "numpy (NBDIST_KERNELS=0)"
    try:
        import nbdist._kernels as _kernels  # optional: a C build; NumPy without it
    except ImportError as exc:
        logging.getLogger(__name__).warning(
            "nbdist's compiled update kernel did not load (%s); the hub uses NumPy, which is "
            "about 2x slower per push on large models. Reinstall nbdist (`pip install -e .` "
            "with a C compiler) to build it, or set NBDIST_KERNELS=0 to choose NumPy quietly.",
            exc)
        return None, "numpy (the compiled kernel did not load)"
    return _kernels, "compiled" + (" (streaming stores)" if _kernels.STREAMING else "")


COMPILED, IMPLEMENTATION = _load()


def _compiled_fits(*arrays: np.ndarray) -> bool:
    return COMPILED is not None and all(a.dtype == _F32 for a in arrays)


def sgd_step(w: np.ndarray, g: np.ndarray, lr: float, scratch: np.ndarray | None) -> None:
    """`w -= float32(lr) * g` in place. `scratch` (same shape) is what NumPy needs (None: only
    with the compiled kernel on float32)."""
    if _compiled_fits(w, g):
        COMPILED.sgd_step(w, g, lr)
    else:
        sgd_step_numpy(w, g, lr, np.empty_like(w) if scratch is None else scratch)


def sgd_step_and_copy(w: np.ndarray, g: np.ndarray, lr: float, scratch: np.ndarray | None,
                      out: np.ndarray, stream: bool = False) -> None:
    """`w -= float32(lr) * g; out[:] = w` in one pass; `stream`: the whole reply is at least
    `STREAM_MIN` floats, so write `out` past the cache (compiled kernel only)."""
    if _compiled_fits(w, g, out):
        COMPILED.sgd_step_copy(w, g, lr, out, stream)
    else:
        sgd_step_and_copy_numpy(w, g, lr, np.empty_like(w) if scratch is None else scratch, out)


def copy_out(dst: np.ndarray, src: np.ndarray, stream: bool) -> None:
    """`dst[:] = src`; `stream`: the whole copy is at least `STREAM_MIN` floats, so write `dst`
    with streaming stores (compiled kernel only; glibc's memcpy is 1.3x slower at 40-80 MB here,
    benchmarks/update_kernel.py)."""
    if stream and _compiled_fits(dst, src):
        COMPILED.copy_stream(dst, src)
    else:
        np.copyto(dst, src)


def adam_step(w: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, alpha: np.float32,
              one_minus_beta_1: np.float32, one_minus_beta_2: np.float32,
              epsilon: np.float32) -> bool:
    """Adam's step (`optimizer_rules.AdamFormula`, no AMSGrad) in one compiled pass; False: not
    compiled here, the caller runs NumPy's formula (the same numbers)."""
    if not _compiled_fits(w, g, m, v):
        return False
    COMPILED.adam_step(w, g, m, v, alpha, one_minus_beta_1, one_minus_beta_2, epsilon)
    return True


def momentum_step(w: np.ndarray, g: np.ndarray, m: np.ndarray, lr: np.float32,
                  momentum: np.float32, nesterov: bool) -> bool:
    """SGD with momentum (`optimizer_rules.SGDFormula`) in one compiled pass; False: not
    compiled here, the caller runs NumPy's formula (the same numbers)."""
    if not _compiled_fits(w, g, m):
        return False
    COMPILED.momentum_step(w, g, m, lr, momentum, nesterov)
    return True


def sgd_step_numpy(w: np.ndarray, g: np.ndarray, lr: float, scratch: np.ndarray) -> None:
    """NumPy's `w -= lr * g`, with `scratch` to avoid allocating per push; block by block, so
    the scratch block is still in cache when it is subtracted."""
    lr32 = np.float32(lr)
    for lo in range(0, w.size, BLOCK):
        hi = min(lo + BLOCK, w.size)
        s = scratch[lo:hi]
        np.multiply(g[lo:hi], lr32, out=s)
        np.subtract(w[lo:hi], s, out=w[lo:hi])


def sgd_step_and_copy_numpy(w: np.ndarray, g: np.ndarray, lr: float, scratch: np.ndarray,
                            out: np.ndarray) -> None:
    """NumPy's `w -= lr * g; out[:] = w` block by block: the three passes share the cache, so
    memory is read once instead of three times."""
    lr32 = np.float32(lr)
    for lo in range(0, w.size, BLOCK):
        hi = min(lo + BLOCK, w.size)
        s, wb = scratch[lo:hi], w[lo:hi]
        np.multiply(g[lo:hi], lr32, out=s)
        np.subtract(wb, s, out=wb)
        out[lo:hi] = wb
