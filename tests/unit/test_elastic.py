"""Workers added mid-run, without processes: what the backend refuses, how the hub admits ids,
the --elastic option; the coordinator's part is in test_coordinator.py."""

from types import SimpleNamespace

import pytest

from nbdist.cluster.engines import Roles
from nbdist.cluster.netaddr import HostNet, Route
from nbdist.config import TrainConfig
from nbdist.core.shard import admit
from nbdist.errors import (
    ClusterError,
    ConfigError,
    ProtocolError,
    TrainingError,
    UnreachableHostError,
)
from nbdist.hub.wire import check_link
from nbdist.modes.async_ps.backend import ClusterBackend
from nbdist.run.elastic import add_workers
from nbdist.run.handle import Run
from nbdist.wire.messages import Control, Hello
from tests.helpers import end


class FakeCluster:
    """What a backend asks of its cluster, without engines: hosts, networks, and for each
    engine the task it runs (`tasks`: engine -> _Task, set by the test)."""

    def __init__(self, nets: dict, ids: list[int]):
        self.nets, self.tasks = nets, {}
        self.client = FakeClient(ids, self.tasks)

    def engine_hosts(self) -> dict:
        return {e: net.hostname for e, net in self.nets.items()}

    def engine_networks(self, engines) -> dict:
        return {e: self.nets[e] for e in engines}

    def kernel_network(self):
        return self.nets[0]


class FakeClient:
    def __init__(self, ids, tasks):
        self.ids, self.tasks = ids, tasks

    def __getitem__(self, engine):
        return SimpleNamespace(apply_async=lambda fn, spec: self.tasks.setdefault(engine, _Task()))


def backend(stream=False, bound="127.0.0.1", hub_host="a"):
    """A cluster backend of engines 0..2 on host a (and `hub_host` for the hub's engine 0):
    hub on 0, worker 0 on engine 1, engine 2 free; engine 3 joins the cluster later."""
    routes = (Route("198.18.0.0", 24, "eth0"),)
    nets = {0: HostNet(hub_host, f"{hub_host}:boot", "198.18.0.13", routes,
                       {"eth0": [("198.18.0.13", 24)]}),
            **{e: HostNet("a", "a:boot", "127.0.0.1") for e in (1, 2, 3)}}
    b = ClusterBackend(FakeCluster(nets, [0, 1, 2]), 1, 1)
    assert b.roles == Roles((0,), (1,), {1: 0})
    b.cluster.client.ids.append(3)
    b.worker_base = SimpleNamespace(stream=stream)  # as start_workers leaves it
    b.bind_hosts = {0: bound}  # the address the hub bound (chosen from the run's first hosts)
    return b


@pytest.mark.parametrize("engines, match", [
    ([7], r"Received: \[7\]; not in the cluster: \[7\]; it has \[0, 1, 2, 3\]"),
    ([], r"Received: \[\]"),
    (["2"], r"not in the cluster: \['2'\]"),
])
def test_unknown_engines_are_refused_naming_the_cluster_s_engines(engines, match):
    with pytest.raises(ClusterError, match=match):
        backend().check_new_engines(engines)


def test_engines_already_in_the_run_are_refused_naming_their_role_and_the_free_ones():
    with pytest.raises(ClusterError, match=r"engine 0 \(a hub shard\), engine 1 \(worker 0\)\)\. "
                                           r"Free engines of the cluster: \[2, 3\]"):
        backend().check_new_engines([0, 1])
    with pytest.raises(ClusterError, match="an engine named twice"):
        backend().check_new_engines([2, 2])
    assert backend().check_new_engines([3, 2]) == [3, 2]


def test_a_streamed_data_set_cannot_take_a_new_worker():
    with pytest.raises(ConfigError, match="streams its data set.*--in-memory-limit"):
        backend(stream=True).check_new_engines([2])


def test_a_hub_on_loopback_or_another_route_refuses_an_engine_of_another_host():
    here = HostNet("a", "a:boot", "127.0.0.1")
    elsewhere = HostNet("b", "b:boot", "198.18.0.12")
    backend().check_reach({2: here})  # same host: loopback reaches it
    with pytest.raises(UnreachableHostError,
                       match=r"Engine 2 \(host b, 198.18.0.12\) cannot reach the hub on engine 0, "
                             r"which listens on 127.0.0.1.*on host a\."):
        backend().check_reach({2: elsewhere})
    backend(bound="198.18.0.13").check_reach({2: elsewhere})  # bound towards that network


def test_joined_engines_are_those_not_seen_and_each_is_reported_once():
    b = backend()
    assert b.joined_engines() == [3] and b.joined_engines() == []
    b.cluster.client.ids.append(4)
    assert b.joined_engines() == [4]


def test_every_shard_admits_just_the_next_worker_id_and_checks_ids_against_it():
    assert "add_worker" in Control.ALL_SHARDS and admit(2, 2) == 3
    with pytest.raises(ValueError, match=r"next id, 2 \(Received: 5\)"):
        admit(2, 5)
    check_link({}, Hello(2), "worker-2/ab", num_workers=3)
    with pytest.raises(ProtocolError, match=r"worker=2 \(0..1\)"):
        check_link({}, Hello(2), "worker-2/ab", num_workers=2)


@pytest.mark.parametrize("mode", ["sync", "local", "simulate"])
def test_add_workers_is_refused_outside_async_mode(mode):
    run = Run(TrainConfig(mode=mode, workers=1), model=None, model_name="model")
    with pytest.raises(ConfigError, match=rf"run.add_workers\(\[2\]\) does not apply to --mode "
                       rf"{mode},.*on a --mode {mode} run\). It works with --mode async:"):
        add_workers(run, [2])


def test_add_workers_is_refused_once_the_run_has_ended():
    run = end(Run(TrainConfig(), model=None, model_name="model"), "finished")
    with pytest.raises(TrainingError,
                       match=r"The run is finished.*Received: run.add_workers\(\[2\]\)"):
        run.add_workers([2])


def test_elastic_is_an_async_option():
    assert TrainConfig(elastic=True).elastic
    with pytest.raises(ConfigError, match=r"--elastic does not apply to --mode local.*Received: "
                       r"--elastic\).*--elastic works with --mode async\."):
        TrainConfig(mode="local", elastic=True)
    with pytest.raises(ConfigError, match="Received: elastic='yes'"):
        TrainConfig(elastic="yes")


def test_magic_flag_elastic_reaches_train():
    import argparse

    from nbdist.flags import add_to_parser, distribute_flags, given_options

    parser = argparse.ArgumentParser()
    add_to_parser(parser, distribute_flags())  # as the magic's parser is built
    assert given_options(parser.parse_args(["--elastic"]))["elastic"] is True
    assert "elastic" not in given_options(parser.parse_args([]))  # TrainConfig: off


class _Task:
    """An ipyparallel AsyncResult as `ClusterBackend.failure` reads it."""

    def __init__(self, error: Exception | None = None):
        self.error = error

    def ready(self):
        return True

    def successful(self):
        return self.error is None

    def get(self, timeout=None):
        if self.error is not None:
            raise self.error


def test_an_added_worker_that_fails_is_written_off_but_a_first_worker_fails_the_run():
    from nbdist.modes.common.worker import WorkerSpec

    b = backend()
    b.start_workers(WorkerSpec("r", bytes(32), 0, [], {}, "model", ("x", "y"), None, 0, 10, 1))
    b.cluster.tasks[2] = _Task(ImportError("no module foo"))  # what engine 2 will run: a failure
    assert b.add_workers([2], announce=lambda worker, engine: None) == [1]
    assert b.failure() is None  # worker 1 was added mid-run: written off, the run goes on
    (lost,) = b.newly_lost()
    assert (lost[0] == 1 and "ImportError on engine 2 (a): no module foo" in lost[1]
            and b.newly_lost() == [])
    b.cluster.tasks[1].error = ValueError("bad cell")  # worker 0, on engine 1
    assert "ValueError on engine 1 (a): bad cell" in str(b.failure())
