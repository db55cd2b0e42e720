"""NumPy's BLAS held to one thread while a worker's own matrix products run (powersgd's
factors, `nbdist.core.low_rank`).

OpenBLAS starts a thread per core and lets each spin for a while after every product; beside a
worker's model step and its hub on the same cores, those spinning threads take the CPU from
both. Measured (benchmarks/network.py --quick, 2 workers on 2 shared cores, 1 Gbit/s):
powersgd:4 trained 1,730 samples/s with NumPy's default threads and 8,274 with one (float32
on the wire: 4,997; int8: 7,070). A hub process starts with one BLAS thread
(`nbdist.hub.launch`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from nbdist.core.compression import parse


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """NumPy's BLAS on one thread inside the block, as many as before after it.

    Example:
        >>> with one_blas_thread():  # doctest: +SKIP
        ...     worker_loop.run()
    """
    from threadpoolctl import threadpool_limits  # only a powersgd worker needs it

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def for_compression(compression: str) -> contextlib.AbstractContextManager:
    """`one_blas_thread()` for a run whose codec multiplies matrices (powersgd), else nothing.

    Example:
        >>> with for_compression("int8"):  # nothing to hold
        ...     pass
    """
    if parse(compression).name == "powersgd":
        return one_blas_thread()
    return contextlib.nullcontext()
