"""Faults on real engines: a worker engine killed mid-run, every worker killed, and no
ipyparallel process left behind. Killing engines would break the session cluster, so these
tests start their own small cluster and check that stopping it leaves nothing running."""

import os
import signal

import psutil
import pytest

import nbdist
from nbdist.errors import WorkersLostError
from tests.helpers import SYNTHETIC_CELL, alive, global_step, wait_for, wait_paused


def ipp_processes(exclude=()) -> list[psutil.Process]:
    """This process's ipyparallel descendants (controller, engines, nannies) not in `exclude`."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in exclude and "ipyparallel" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found


def assert_all_exit(procs, timeout=30.0):
    """Every one of `procs` exits within `timeout` (engine nannies take a few seconds)."""
    _, left = psutil.wait_procs(procs, timeout=timeout)
    assert not left, f"left running: {[(p.pid, p.cmdline()[:3]) for p in left]}"


@pytest.fixture(scope="module")
def own_cluster():
    """Four engines of our own: one hub, and workers that the tests may kill."""
    from nbdist.cluster.engines import Cluster

    before = {p.pid for p in ipp_processes()}
    handle = Cluster.start(4)
    handle.pids = dict(zip(handle.engine_ids, handle.client[:].apply_sync(os.getpid), strict=True))
    started = ipp_processes(exclude=before)
    yield handle
    handle.stop()
    assert_all_exit(started)


def kill_worker_engine(cluster, run, worker):
    """Kill `worker`'s engine while `run` (started with pause_at) holds at its step: mid-run
    whatever the machine's speed. The run is resumed by the caller."""
    wait_paused(run)
    os.kill(cluster.pids[run.nodes.set_index("worker")["engine"][worker]], signal.SIGKILL)


@pytest.mark.parametrize("options", [dict(algorithm="asgd"), dict(algorithm="ssp", staleness=0)],
                         ids=["asgd", "ssp"])
def test_a_killed_worker_engine_is_written_off_and_the_other_finishes_the_run(own_cluster, options):
    ns = {}
    epochs = 8
    run = nbdist.train(SYNTHETIC_CELL, cluster=own_cluster, namespace=ns, workers=2, epochs=epochs,
                       batch_size=8, pause_at=40, **options)
    kill_worker_engine(own_cluster, run, worker=1)
    run.resume()
    run.wait(timeout=240)  # ssp with S = 0: the survivor must not wait for the dead one forever
    assert run.status == "finished" and run.error is None
    nodes = run.nodes
    assert list(nodes["state"]) == ["done", "lost"]
    lost = run.events[run.events["event"] == "worker_lost"]
    assert list(lost["worker"]) == [1] and lost["step"].iloc[0] < global_step(run)
    assert any(w.startswith("worker 1 was lost") for w in run.warnings), run.warnings
    # every sample of every epoch trained on exactly once: the dead worker's chunk was redone
    assert run.stats["epoch_samples"] == [900] * epochs
    assert nodes["samples"].sum() == 900 * epochs
    acc = ns["model"].evaluate(ns["x_test"], ns["y_test"], verbose=0)[1]
    assert acc > 0.85
    # one validation per epoch, none lost
    assert len(run.history["val_accuracy"].dropna()) == epochs


def test_when_every_worker_is_killed_the_run_fails_with_a_clear_error(own_cluster):
    run = nbdist.train(SYNTHETIC_CELL, cluster=own_cluster, namespace={}, workers=1, batch_size=8,
                       pause_at=20)
    kill_worker_engine(own_cluster, run, worker=0)  # paused: it fails without a resume
    with pytest.raises(WorkersLostError, match=r"All 1 workers were lost .*%nbdist start N"):
        run.wait(timeout=120)
    assert run.status == "failed" and list(run.nodes["state"]) == ["lost"]
    from nbdist.hub.launch import running_hubs

    (hub_engine,) = [h["engine"] for h in run.hubs]
    assert own_cluster.client[hub_engine].apply_sync(running_hubs) == []  # the hub was stopped


def test_ctrl_c_in_wait_stops_the_run_and_the_engines_take_a_new_run(cluster):
    import _thread
    import threading

    from nbdist.hub.launch import running_hubs

    ns = {}
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace=ns, workers=2, batch_size=8,
                       pause_at=20)  # held there until the interrupt: it cannot finish first
    # a kernel's SIGINT handler even where pytest runs as a background job, which ignores
    # SIGINT (interrupt_main then does nothing); `with run`: a failure here leaves no run going
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with run:
            wait_paused(run)
            threading.Timer(0.5, _thread.interrupt_main).start()  # what Jupyter's "interrupt" does
            with pytest.raises(KeyboardInterrupt):
                run.wait(timeout=120)
            assert run.done()  # the interrupted wait stopped the run and waited for its end
    finally:
        signal.signal(signal.SIGINT, previous)
    assert run.done() and run.status == "stopped" and run.error is None
    assert cluster.client[:].apply_sync(running_hubs) == [[]] * 3  # hub and workers left
    again = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, epochs=1,
                         wait=True)
    assert again.status == "finished"


@pytest.mark.parametrize("how", ["magic", "cluster"])
def test_stopping_the_cluster_during_a_run_leaves_no_process_behind(ip, how):
    """`%nbdist stop` (or Cluster.stop) while a run still trains: the run is stopped first,
    then engines, nannies and controller all exit."""
    before = {p.pid for p in ipp_processes()}
    ip.run_line_magic("nbdist", "start 2")
    magics = ip.magics_manager.registry["NbdistMagics"]
    started = ipp_processes(exclude=before)
    assert len(started) >= 3  # controller, two engines (and their nannies)
    ip.run_cell_magic("distribute", "--workers 1 --pause-at 20 --batch-size 8 --no-dashboard -o r",
                      SYNTHETIC_CELL)
    run = wait_paused(ip.user_ns["r"])  # still going when the cluster stops, whatever the speed
    if how == "magic":
        ip.run_line_magic("nbdist", "stop")
    else:
        magics.cluster.stop()
        magics.cluster = None
    assert run.done() and run.status == "stopped"
    assert_all_exit(started)


KERNEL_SCRIPT = '''
import json, os, sys, time
import psutil
from nbdist.cluster.engines import Cluster
cluster = Cluster.start(1)
family = [p.pid for p in psutil.Process().children(recursive=True)]
print(json.dumps({"engines": cluster.client[:].apply_sync(os.getpid), "family": family}),
      flush=True)
time.sleep(600)
'''


def test_engines_and_controller_do_not_outlive_a_killed_kernel(tmp_path):
    """A kernel SIGKILLed with a cluster up (no atexit, no stop): nbdist's watchdog ends
    the controller, engines and nannies; then it exits too."""
    import json
    import subprocess
    import sys

    script = tmp_path / "kernel.py"
    script.write_text(KERNEL_SCRIPT)
    kernel = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(kernel.stdout.readline())
        family = [psutil.Process(pid) for pid in info["family"]]
        commands = [" ".join(p.cmdline()) for p in family if alive(p)]
        assert any("nbdist.cluster.watchdog" in c for c in commands)
        assert any("ipyparallel.controller" in c for c in commands)
        assert set(info["engines"]) <= set(info["family"])
    finally:
        kernel.kill()
        kernel.wait(10)
    wait_for(lambda: not [p for p in family if alive(p)], 30,
             what=lambda: f"exit of every process (left running: "
                          f"{[p.pid for p in family if alive(p)]})")



# -- bad input (the cases of the async issue are in test_async_cluster.py) ----------------------

@pytest.mark.parametrize("extra,match", [
    ("x_train[3, 2] = float('inf')",
     r"x_train contains NaN or inf in 1 sample\(s\) \(first at index 3\)"),
    ("x_train = x_train[:, :5]",
     r"x_train \(shape \(900, 5\).*do not fit the model \(it expects inputs of "
     r"shape \(None, 8\)\).*expected axis -1 of input shape to have value 8"),
    ("y_train = y_train.astype(str)", r"y_train holds <U\d+ values, expected numbers.*np.unique"),
    ("x_train = x_train.astype(object)", r"x_train holds object values, expected numbers"),
    ("y_train = y_train + 7", r"do not fit the model.*label value of \d+"),
])
def test_bad_data_is_refused_before_training_and_engines_stay_ready(cluster, extra, match):
    from nbdist.errors import DataError
    from nbdist.hub.launch import running_hubs

    with pytest.raises(DataError, match=match):
        nbdist.train(SYNTHETIC_CELL + extra + "\n", cluster=cluster, namespace={}, workers=2)
    assert cluster.client[:].apply_sync(running_hubs) == [[]] * 3


def test_a_loss_that_becomes_nan_mid_run_stops_the_run_naming_the_step(cluster):
    from nbdist.errors import TrainingError

    # finite data (passes the data check), but one sample overflows float32 inside the model
    cell = SYNTHETIC_CELL + "x_train[17] = 3e38\n"
    run = nbdist.train(cell, cluster=cluster, namespace={}, workers=2, epochs=3)
    with pytest.raises(TrainingError,
                       match=r"engine \d( on [^\]]+)?\] The (loss|gradient norm) became (nan|inf) "
                             r"at step \d+ on worker \d \(epoch \d+\)\. Lower the learning rate"):
        run.wait(timeout=120)
    assert run.status == "failed"
    again = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, epochs=1,
                         wait=True)
    assert again.status == "finished"


@pytest.mark.parametrize("line,match", [
    ("--batch-size 0", r"--batch-size"),
    ("--workers 0", r"--workers"),
    ("--workers 2 --slowdown 1,0", r"--slowdown factors must be between 1"),
    ("--workers 2 --slowdown 1,-2", r"--slowdown factors must be between 1"),
    ("--workers 2 --slowdown 1,1e9", r"--slowdown factors must be between 1"),
    ("--workers 2 --slowdown 1,nan", r"--slowdown"),
    ("--workers 2 --slowdown fast", r"--slowdown expects numbers"),
    ("--bogus 3", None),
    ("--epochs", None),
])
def test_bad_flags_are_refused_before_training(cluster, ip, line, match):
    from IPython.core.error import UsageError

    from nbdist.hub.launch import running_hubs

    ip.magics_manager.registry["NbdistMagics"].cluster = cluster
    with pytest.raises(UsageError, match=match):  # the magic's misuse: one line, no traceback
        ip.run_cell_magic("distribute", line + " --wait", SYNTHETIC_CELL)
    assert cluster.client[:].apply_sync(running_hubs) == [[]] * 3


def test_an_engine_that_does_not_answer_in_time_is_named_with_what_its_controller_holds(cluster):
    """A request that times out says whether the engine is still listed and busy (its queue)
    or gone, so that a user (and a CI log) tells an overloaded engine from a dead one."""
    import time

    from nbdist.cluster.engines import get_within
    from nbdist.errors import EngineTimeoutError

    engine = cluster.engine_ids[0]
    busy = cluster.client[engine].apply_async(time.sleep, 3)
    late = cluster.client[engine].apply_async(os.getpid)
    with pytest.raises(EngineTimeoutError, match=rf"Engine {engine} did not answer a ping within "
                       r"1s \(Received: no reply; the controller lists it, with [12] request\(s\) "
                       r"queued for it"):
        get_within(late, engine, "a ping", timeout=1)
    busy.get(30)
    late.get(30)
