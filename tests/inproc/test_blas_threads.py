"""A powersgd worker's matrix products run on one BLAS thread, and the thread count is given
back after the run (nbdist.engine.blas_threads)."""

from threadpoolctl import threadpool_info

from nbdist.engine.blas_threads import one_blas_thread


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_one_blas_thread_inside_the_block_and_as_many_as_before_after_it():
    import numpy as np

    np.ones((4, 4)) @ np.ones((4, 4))  # NumPy's BLAS is loaded
    before = blas_threads()
    assert before, "NumPy's BLAS was not found"
    with one_blas_thread():
        assert blas_threads() == [1] * len(before)
    assert blas_threads() == before
