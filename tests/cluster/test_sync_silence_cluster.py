"""A sync run whose rank 0 evaluates for longer than the hub's silence limit: the other rank
waits in the allreduce meanwhile, so both are silent together, and that is no loss. (Both
used to be written off, failing a healthy run with WorkersLostError: the intermittent stall of
the sync stop/resume test, whose first evaluation after a resume was slow under load.)"""

import pytest

import nbdist
from tests.helpers import SYNTHETIC_CELL

pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
pytestmark = [pytest.mark.cluster, pytest.mark.horovod]

# a validation metric that sleeps 2 s per batch of evaluation (two batches of the 300 test
# samples); a training step updates the metrics too (their increments ride in the reports), on
# a rank's 32 samples, and does not sleep
SLOW_EVAL_CELL = SYNTHETIC_CELL.replace('metrics=["accuracy"]',
                                        'metrics=["accuracy", Slow()]').replace(
    "model = keras", '''import time
import tensorflow as tf
class Slow(keras.metrics.Metric):
    def __init__(self, name="slow", **kw):
        super().__init__(name=name, **kw)
        self.batches = self.add_variable(shape=(), initializer="zeros", name="batches")
    def update_state(self, y_true, y_pred, sample_weight=None):
        tf.py_function(lambda n: time.sleep(2.0 if int(n) > 32 else 0.0),
                       [tf.shape(y_true)[0]], [])
        self.batches.assign_add(1.0)
    def result(self):
        return self.batches
model = keras''', 1)


def test_ranks_silent_while_rank_0_evaluates_are_not_written_off(cluster, monkeypatch):
    import nbdist.core.liveness as liveness

    monkeypatch.setattr(liveness, "LOST_FIRST_S", 1.0)  # the sync hub runs in this kernel
    run = nbdist.train(SLOW_EVAL_CELL, cluster=cluster, namespace={}, mode="sync", workers=2,
                       epochs=2, batch_size=32, wait=True)
    assert run.status == "finished" and list(run.history["val_slow"].dropna()) == [2.0, 2.0]
    assert not [e for e in run.events.get("event", []) if e == "worker_lost"]
