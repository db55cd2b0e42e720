"""Every --algorithm of %%distribute --mode async learns on a real cluster with 2 workers."""

import numpy as np
import pytest

import nbdist
from nbdist.errors import ConfigError
from tests.helpers import SYNTHETIC_CELL, wait_for, wait_paused


@pytest.mark.parametrize("options", [
    {"algorithm": "asgd"},
    {"algorithm": "hogwild"},
    {"algorithm": "dc-asgd"},
    {"algorithm": "dc-asgd-a"},
    {"algorithm": "ddc-asgd"},
    {"algorithm": "softsync", "n": 1},
    {"algorithm": "ssp", "staleness": 0},
    {"algorithm": "group"},
    {"algorithm": "easgd", "local_steps": 4},
    {"algorithm": "diloco"},  # H = 500: a round is a worker's share of an epoch
    {"algorithm": "diloco", "local_steps": 10},
    {"algorithm": "async-local-sgd", "local_steps": 10},  # delayed Nesterov, no barrier
    {"algorithm": "asgd", "staleness_lr": True, "servers": 2, "workers": 1},
    {"algorithm": "asgd", "local_steps": 4, "server_optimizer": "momentum"},
    {"algorithm": "dc-asgd-a", "overlap": True},
], ids=lambda o: "-".join(f"{v}" if k == "algorithm" else f"{k}={v}" for k, v in o.items()))
def test_every_rule_learns_with_two_workers(cluster, options):
    options = {"workers": 2, **options}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, epochs=3, batch_size=16,
                       wait=True, **options)
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.8  # chance is 1/3
    assert run.nodes["samples"].sum() == 3 * 900


def test_streaming_diloco_sends_one_fragment_each_way_per_round_and_learns(cluster):
    """Over TCP with int8 pushes: the floats a round moves (push and pull, the evaluations'
    full pulls included) are about 2/P of the model's, not the 2 whole copies DiLoCo sends."""
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, epochs=3,
                       batch_size=16, algorithm="streaming-diloco", local_steps=20,
                       transport="tcp", compression="int8", wait=True)
    assert run.history["val_accuracy"].dropna().iloc[-1] > 0.8
    assert run.nodes["samples"].sum() == 3 * 900
    # the data's last round, pushed by a worker while the other has none left: applied at once
    assert "group_timeout" not in set(run.events.get("event", []))
    whole = 4 * (8 * 16 + 16 + 16 * 3 + 3)  # the model's float32 bytes
    per_round = run.traffic["float32_bytes"].sum() / run.nodes["steps"].sum()
    # 4 fragments: 0.25 of 2 copies, and the hellos' and evaluations' full pulls (0.28 to 0.32
    # measured); whole pushes and pulls would be 1
    assert per_round < 0.5 * 2 * whole
    assert run.traffic["compression_ratio"].max() < 0.8  # int8 pushes, float32 fragment pulls
    with pytest.raises(ConfigError, match="'fragments' of streaming-diloco is fixed for the run"):
        run.set_option("fragments", 2)  # the workers cut their pushes by it


def test_a_group_step_at_an_epoch_gate_goes_on_without_members_left_with_no_batch(cluster):
    """The cell's fit call with epochs of 7 batches over 2 streaming-diloco workers (rounds of
    5 steps and 1 of overlap): an epoch's second round has one worker's push, and the other
    has no batch left before the gate. The hub applies it with the push that came, at once,
    instead of waiting its 5 s for the missing one at every epoch (measured on the emulated
    lab: 6 of 12 epochs paid it)."""
    cell = SYNTHETIC_CELL + ("model.fit(x_train, y_train, batch_size=16, epochs=4, "
                             "steps_per_epoch=7, validation_data=(x_test, y_test), verbose=0)\n")
    run = nbdist.train(cell, cluster=cluster, namespace={}, workers=2, transport="tcp",
                       algorithm="streaming-diloco", local_steps=20, wait=True)
    assert run.status == "finished", run.error
    events = run.events
    assert "group_timeout" not in set(events.get("event", [])), events
    assert run.nodes["samples"].sum() == 4 * 7 * 16


def test_ssp_zero_keeps_workers_in_lockstep(cluster):
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, epochs=2,
                       batch_size=16, algorithm="ssp", staleness=0, slowdown="1,3", wait=True)
    steps = run.nodes["steps"]
    assert abs(steps[0] - steps[1]) <= 1  # BSP: nobody gets a clock ahead, whatever the speeds


def test_group_with_one_group_equals_synchronous_sgd(cluster):
    """One group of 2 workers averages their gradients for the same weights every step: the
    Horovod sync run with the group's rate (linear scaling: 2 x lr) must end at the same weights."""
    pytest.importorskip("horovod.tensorflow")
    cell = SYNTHETIC_CELL.replace("import keras\n",
                                  "import keras\nkeras.utils.set_random_seed(3)\n")
    finals = []
    for options in ({"mode": "async", "algorithm": "group", "groups": 1, "lr": 0.1},
                    {"mode": "sync", "lr": 0.2}):
        ns = {}
        nbdist.train(cell, cluster=cluster, namespace=ns, workers=2, epochs=1, batch_size=30,
                     no_validation=True, wait=True, **options)
        finals.append(np.concatenate([v.numpy().ravel() for v in ns["model"].trainable_variables]))
    np.testing.assert_allclose(finals[0], finals[1], rtol=1e-4, atol=1e-5)


def test_group_auto_forms_groups_by_speed_and_regroup_works(cluster):
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, epochs=40,
                       batch_size=8, algorithm="group", slowdown="1,4")

    def regroups():
        events = run.events
        # other events (the backend's note, ...) may come first: no "groups" column yet
        return (events.loc[events["event"] == "regroup", "groups"].tolist()
                if "groups" in events else [])

    wait_for(regroups, 60, what="groups formed")
    assert sorted(run.nodes["group"]) == [0, 1]  # 4x apart: two singleton groups
    before = len(regroups())
    run.set_slowdown(1, 1.0)
    run.regroup()
    wait_for(lambda: len(regroups()) > before, 60, what="the regroup")
    run.stop()
    run.wait(timeout=60)
    assert len(regroups()) == before + 1  # regroup() re-formed the groups from current speeds
    assert sorted(w for g in regroups()[-1] for w in g) == [0, 1]  # a partition of the workers
    events = run.events
    set_slowdown = events[events["event"] == "set_slowdown"]
    assert set_slowdown["worker"].iloc[0] == 1 and set_slowdown["factor"].iloc[0] == 1.0


def test_live_option_change_and_unknown_option_name(cluster):
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, batch_size=8,
                       algorithm="dc-asgd-a", algo_options="lambda0=1", pause_at=20)
    wait_paused(run)  # changed mid-run, held at step 20
    run.set_option("lambda0", 0.5)
    with pytest.raises(ConfigError, match="Valid: lambda0=.*ms_decay"):
        run.set_option("lamda0", 0.5)
    run.stop()
    run.wait(timeout=60)
    assert run.stats["rule_options"]["lambda0"] == 0.5
    assert run.stats["hub_bytes"] > 0
