"""--mode local in a child process with a given TensorFlow thread count: the thread count of
the async worker it is compared with (tests/cluster/test_local_equals_worker.py). Threads
decide how TensorFlow cuts a convolution's sums, so two thread counts round differently, and
a process fixes its count before TensorFlow starts.

    python -m tests.local_child INTRA INTER SEED OUT.npz NAME...

Writes, for each cell NAME of tests.helpers.LOCAL_WORKER_CELLS, the trained model's weights
(`NAME/0`, `NAME/1`, ...) after one epoch at batch 32 with Keras seeded with SEED first.
"""

from __future__ import annotations

import contextlib
import io
import sys

import numpy as np


def main(intra: int, inter: int, seed: int, out: str, names: list[str]) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    import keras

    import nbdist
    from tests.helpers import LOCAL_WORKER_CELLS

    weights = {}
    for name in names:
        keras.utils.set_random_seed(seed)
        ns: dict = {}
        with contextlib.redirect_stdout(io.StringIO()):
            run = nbdist.train(LOCAL_WORKER_CELLS[name], namespace=ns, mode="local", epochs=1,
                               batch_size=32, wait=True)
        assert run.status == "finished", run.error
        weights.update({f"{name}/{i}": np.asarray(v.numpy())
                        for i, v in enumerate(ns["model"].weights)})
    np.savez(out, **weights)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:])
