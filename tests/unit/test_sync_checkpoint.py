"""The sync-mode checkpoint format without processes: rank 0's state through the hub, save,
load and back to a resume position; a sync checkpoint's own checks."""

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from nbdist.algorithms import make_rule
from nbdist.checkpoint import store as checkpoint
from nbdist.checkpoint.sync_state import resume_fields, start_position
from nbdist.config import TrainConfig
from nbdist.core.coordinator import Plan
from nbdist.core.schedule import schedule_state
from nbdist.core.updater import Updater
from nbdist.errors import CheckpointError
from nbdist.hub.export import hub_state
from nbdist.wire.messages import SyncState

LAYOUT = {"trainable": [[2, 3], [3]], "non_trainable": [[2]]}  # 9 parameters, 2 non-trainable


def _sync_hub(epoch, offset, steps=7, final=False):
    """A sync run's hub (no parameters) holding a snapshot rank 0 sent."""
    plan = Plan(num_workers=2, num_samples=10, epochs=3, batch_size=2, lr=0.1, has_validation=False,
                algorithm="asgd")
    state = SyncState(seq=1, final=final, epoch=epoch, offset=offset, steps=steps, lr=0.05,
                      iterations=steps, optimizer="SGD", slots=LAYOUT["trainable"])
    arrays = [np.arange(9, dtype=np.float32), np.array([1, 2], np.float32),
              np.full(9, 0.5, np.float32)]
    return SimpleNamespace(plan=plan, updater=Updater(make_rule("asgd", 0, 2, None), None),
                           sync_snapshot=(state, arrays))


def _save(tmp_path, hub):
    info = {"run_id": "s1", "config": TrainConfig(mode="sync", epochs=3).to_dict(), "cell": "x = 1",
            "layout": LAYOUT, "num_samples": 10, "num_workers": 2}
    return checkpoint.save(str(tmp_path), [hub_state(hub, hub.sync_snapshot)], info)


def test_rank_0s_state_goes_through_save_and_load_into_a_resume_position(tmp_path):
    ckpt = checkpoint.load(_save(tmp_path, _sync_hub(epoch=1, offset=4)))
    np.testing.assert_array_equal(ckpt.params, np.arange(9, dtype=np.float32))
    np.testing.assert_array_equal(ckpt.non_trainable, [1, 2])
    assert ckpt.meta["schedule"]["remaining"] == [0, 6] and ckpt.meta["epochs_done"] == 1.4
    assert ckpt.meta["shards"][0]["lr"] == 0.05 and ckpt.meta["shards"][0]["version"] == 7
    assert start_position(ckpt, 3) == (1, 4)
    assert start_position(ckpt, 5) == (1, 4)
    fields = resume_fields(ckpt, 3)
    assert fields["resume"] == {"epoch": 1, "offset": 4, "steps": 7, "iterations": 7,
                                "slots": LAYOUT["trainable"]}
    np.testing.assert_array_equal(fields["initial_slots"], np.full(9, 0.5))
    assert resume_fields(None, 3) == {}


def test_an_epoch_done_to_its_last_sample_resumes_at_the_next_epoch(tmp_path):
    assert schedule_state(10, 3, 0, 10) == schedule_state(10, 3, 1, 0)
    ckpt = checkpoint.load(_save(tmp_path, _sync_hub(epoch=2, offset=10, final=True)))
    assert ckpt.meta["epochs_done"] == 3.0
    assert start_position(ckpt, 3) == (3, 0)  # nothing left
    assert start_position(ckpt, 4) == (3, 0)  # train one more epoch


def test_a_sync_checkpoint_with_a_damaged_optimizer_entry_is_refused(tmp_path):
    path = _save(tmp_path, _sync_hub(epoch=0, offset=2))
    with open(path) as f:
        meta = json.load(f)
    meta["sync"]["slots"] = [[2, 3]]  # 6 floats listed, 9 saved
    with open(path, "w") as f:
        json.dump(meta, f)
    with pytest.raises(CheckpointError, match="optimizer state does not hold the 6 floats"):
        checkpoint.load(path)
    meta.pop("sync")
    with open(path, "w") as f:
        json.dump(meta, f)
    with pytest.raises(CheckpointError, match="its mode and its 'sync' entry disagree"):
        checkpoint.load(path)


class _Hub:
    """The kernel's control line to a sync run's hub, as `fresh_state` uses it: every `state`
    request is answered, with rank 0's new state only after it sent one."""

    def __init__(self, sent_after: int):
        self.sent_after, self.asked, self.replies = sent_after, 0, 0

    def control(self, send_state):
        self.asked += 1

    def state(self):
        self.replies += 1
        fresh = self.asked and self.replies > self.sent_after
        hub = _sync_hub(0, 2)
        state, buffers = hub_state(hub, hub.sync_snapshot)
        return [(dataclasses.replace(state, state_seq=2 if fresh else 1), buffers)]


def test_fresh_state_waits_for_rank_0_s_next_state_not_for_the_wire_s_next_message():
    from nbdist.checkpoint.sync_state import fresh_state
    from nbdist.errors import TrainingError

    hub = _Hub(sent_after=4)
    ((state, _),) = fresh_state(hub, final=False, timeout=5)
    assert state.state_seq == 2 and hub.replies == 5 and hub.asked == 1
    with pytest.raises(TrainingError,
                       match="did not send its weights for the checkpoint within 0s"):
        fresh_state(_Hub(sent_after=10**6), final=False, timeout=0.2)


def test_fresh_state_stops_waiting_once_rank_0_has_returned():
    """A rank 0 whose task has returned (its last epoch ended) sends no more state: the wait
    ends at the next look, not at the timeout (it held every sync run's end 30 s)."""
    from nbdist.checkpoint.sync_state import fresh_state
    from nbdist.errors import TrainingError

    hub, looks = _Hub(sent_after=10**6), []
    with pytest.raises(TrainingError, match="Rank 0 had ended its training"):
        fresh_state(hub, final=False, timeout=3600, ended=lambda: looks.append(1) or len(looks) > 2)
    assert hub.replies == 4 and len(looks) == 3  # the first reply, then one per look
