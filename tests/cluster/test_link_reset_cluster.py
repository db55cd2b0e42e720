"""Links that come back, on a real cluster: every line to the hub goes through a TCP relay
(tests/relay.py) that resets its connections again and again mid-run (a flaky switch, a NAT that
forgets): the workers' lines (on their engines, `--transport tcp` as across hosts), a sync
rank's metrics line, and the kernel's line. Each comes back with new credentials and the run
finishes with every worker (before: ZeroMQ reconnected with the spent one-time token, the gate
refused it forever, the workers were written off and the kernel's watch failed the run)."""

import pytest

import nbdist
from tests.helpers import PIPELINE_SKIP_CELL, SYNTHETIC_CELL
from tests.relay import relay_lines_once, relay_stage_links_once, relayed

RESET_EVERY_S = 0.4
RESET_AFTER_S = 0.3  # the first reset; the runs below last a few seconds on an idle machine too
RESETS = 12


@pytest.fixture
def relays_on_every_line(cluster):
    """Relays on the next run's lines to the hubs: each engine's (workers, sync ranks) and the
    kernel's (this process); yields a function that returns what they did (and takes back the
    patches)."""
    engines = cluster.client[:]
    engines.apply_sync(relay_lines_once, "nbdist.hub.client", RESET_EVERY_S, RESETS, RESET_AFTER_S)
    relay_lines_once("nbdist.hub.control", RESET_EVERY_S * 1.3, RESETS, RESET_AFTER_S)
    done = []

    def report():
        if not done:
            done.append(([seen for each in engines.apply_sync(relayed) for seen in each],
                         relayed()))
        return done[0]

    yield report
    report()


def assert_came_back(lines: list[dict]) -> None:
    """Each set of lines was reset mid-run, and each of its lines made a new socket."""
    assert lines
    for seen in lines:
        assert min(seen["resets"]) >= 2, seen
        assert min(seen["redials"]) >= 2, seen


def test_lines_reset_again_and_again_come_back_and_the_run_finishes(cluster,
                                                                    relays_on_every_line):
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, batch_size=8,
                       epochs=12, timeout=10.0, transport="tcp", wait=True)
    workers, kernel = relays_on_every_line()
    assert run.status == "finished" and run.error is None, run.error
    assert (run.events["event"] != "worker_lost").all(), run.events
    assert run.stats["epoch_samples"] == [900] * 12
    assert len(workers) == 2  # both workers' lines went through relays
    assert_came_back(workers)
    assert_came_back(kernel)


@pytest.mark.horovod
def test_a_sync_runs_metrics_lines_reset_again_and_again_come_back(cluster, relays_on_every_line):
    """In --mode sync each rank reports to the hub on its metrics line, which a reset ended
    for good (the run failed)."""
    pytest.importorskip("horovod.tensorflow", reason="Horovod is built by `make horovod`")
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, mode="sync", workers=2,
                       batch_size=8, epochs=6, timeout=10.0, wait=True)
    ranks, kernel = relays_on_every_line()
    assert run.status == "finished" and run.error is None, run.error
    assert len(ranks) == 2
    assert_came_back(ranks)
    assert_came_back(kernel)


def test_pipeline_stage_links_reset_again_and_again_come_back_and_the_run_finishes(cluster):
    """Each stage's sockets to its neighbour and to the kernel (arrays in frames, --transport
    tcp) through relays reset every 0.25 s: each comes back, sends its latest messages again
    (the receiver drops those it had as replays), and the run finishes (before: the stage's
    socket was refused at the gate for good and its neighbour waited until --timeout)."""
    engines = cluster.client[:]
    engines.apply_sync(relay_stage_links_once, 0.25, RESETS, 0.3)  # a short run: soon, often
    try:
        run = nbdist.train("B = 16\n" + PIPELINE_SKIP_CELL, cluster=cluster, namespace={},
                           mode="pipeline", stages=2, micro_batches=4, batch_size=16, epochs=10,
                           partition="uniform", transport="tcp", timeout=10.0)
        run.wait(timeout=240)
    finally:
        stages = [seen for each in engines.apply_sync(relayed) for seen in each]
    assert run.status == "finished" and run.error is None, run.error
    assert len(stages) == 2
    for seen in stages:
        assert min(seen["resets"]) >= 2, seen
        (redials,) = seen["redials"]
        assert min(redials.values()) >= 2, seen
