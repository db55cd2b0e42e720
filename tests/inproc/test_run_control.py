"""Controls that race the end of a run: the kernel's control line knows it is closed."""

import pytest

from nbdist.config import TrainConfig
from nbdist.errors import TrainingError
from nbdist.hub.control import HubControl
from nbdist.run.handle import Run


def test_a_control_after_the_line_closed_says_the_run_ended_and_stop_is_a_no_op():
    control = HubControl(b"k" * 32, [{"tcp": "tcp://127.0.0.1:9"}], timeout=1.0)
    control.close()
    with pytest.raises(TrainingError, match="The run has ended"):
        control.control(paused=True)
    run = Run(TrainConfig(), model=None, model_name="model")
    # the monitor closed the line, the run has not ended yet
    run.state.control, run.state.status = control, "running"
    run.stop()  # nothing left to stop: not an error
    with pytest.raises(TrainingError, match="The run has ended"):
        run.pause()
