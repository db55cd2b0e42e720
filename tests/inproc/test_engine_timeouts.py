"""An engine that does not answer in time is named, with what its controller says of it (the
message asks the controller from a thread, so that a stuck controller cannot hang it)."""

import pytest


def test_an_engine_that_does_not_answer_is_named():
    from nbdist.cluster.engines import get_within
    from nbdist.errors import EngineTimeoutError

    class Stuck:
        def get(self, timeout):
            raise TimeoutError("Result not ready.")

    with pytest.raises(EngineTimeoutError,
                       match=r"Engine 3 did not answer joining hub shard 1 within 2s "
                             r"\(Received: no reply; its controller could not be asked about "
                             r"it: .*\).*%nbdist stop") as info:
        get_within(Stuck(), 3, "joining hub shard 1", timeout=2)
    assert info.value.engine_id == 3
