"""The kernel's periodic copy of a run's weights and state (`nbdist.run.monitor.keep`): a copy
that fails because training has ended is no news for the user; one that fails while the
workers train is a warning."""

import logging

import numpy as np
import pytest

from nbdist.checkpoint.sync_state import RankEndedError
from nbdist.config import TrainConfig
from nbdist.errors import TrainingError
from nbdist.run import monitor
from nbdist.run.monitor import keep
from nbdist.run.state import RunState


class Backend:
    """What `keep` asks of a sync run's backend (a stand-in: the race it decides on, rank 0
    returned while rank 1 is still returning, cannot be timed on a real cluster)."""

    def __init__(self, error: Exception, running: bool):
        self.error, self.running = error, running

    def current_weights(self, control):
        return np.ones(3, np.float32), np.zeros(0, np.float32)

    def checkpoint_state(self, control, final):
        raise self.error

    def workers_running(self):
        return self.running


@pytest.mark.parametrize(("error", "running", "level"), [
    (RankEndedError("Rank 0 had ended its training"), True, logging.INFO),
    (TrainingError("Rank 0 did not send its weights"), False, logging.INFO),
    (TrainingError("Rank 0 did not send its weights"), True, logging.WARNING),
])
def test_a_copy_that_fails_only_because_training_ended_is_not_a_warning(caplog, error, running,
                                                                        level):
    state = RunState(config=TrainConfig(mode="sync"), model=None, model_name="model",
                     run_id="r1", backend=Backend(error, running))
    with caplog.at_level(logging.INFO, logger=monitor.log.name):
        keep(state, "step 9, after epoch 3 ended")
    assert [r.levelno for r in caplog.records] == [level]
    assert state.kept[0].tolist() == [1.0, 1.0, 1.0] and state.kept[2] is None  # the weights kept
