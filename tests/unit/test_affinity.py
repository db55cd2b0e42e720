import os

import pytest

from nbdist.cluster import affinity
from nbdist.cluster.affinity import Placement, plan_cores
from nbdist.config import Pin, TrainConfig
from nbdist.errors import ConfigError


def test_two_cores_one_hub_one_worker_get_a_core_each():
    assert plan_cores((0, 1), 1, 1, "hub", 0) == Placement((1,), 1)
    assert plan_cores((0, 1), 1, 1, "worker", 0) == Placement((0,), 1)


def test_workers_split_the_cores_left_by_the_hubs_in_contiguous_blocks():
    cores = (0, 1, 2, 3, 4, 5, 6, 7)
    assert [plan_cores(cores, 2, 3, "hub", i) for i in range(2)] == [Placement((6,), 1), Placement((7,), 1)]
    # 6 cores for 3 workers: 2 each
    assert [plan_cores(cores, 2, 3, "worker", i) for i in range(3)] == [
        Placement((0, 1), 2), Placement((2, 3), 2), Placement((4, 5), 2)]


def test_uneven_split_differs_by_at_most_one_core_and_uses_them_all():
    cores = (3, 5, 7, 9, 11)  # not 0..n-1: an engine started under taskset
    blocks = [plan_cores(cores, 0, 2, "worker", i).cores for i in range(2)]
    assert blocks == [(3, 5), (7, 9, 11)]


def test_too_few_cores_or_no_worker_leaves_everything_unpinned():
    assert plan_cores((0, 1), 1, 2, "worker", 1) is None  # one core for two workers
    assert plan_cores((0,), 1, 1, "hub", 0) is None
    assert plan_cores((0, 1), 2, 0, "hub", 1) is None  # a host of hubs only: nothing to keep apart


def test_ranks_without_hub_each_get_their_own_cores():
    assert [plan_cores((0, 1), 0, 2, "worker", i) for i in range(2)] == [Placement((0,), 1), Placement((1,), 1)]


@pytest.mark.parametrize("role,index", [("server", 0), ("hub", 1), ("worker", -1)])
def test_a_role_or_index_outside_the_host_is_refused(role, index):
    with pytest.raises(ValueError, match="role|outside"):
        plan_cores((0, 1, 2), 1, 1, role, index)


def test_pin_option_is_checked():
    assert TrainConfig(pin="AUTO").pin is Pin.AUTO
    with pytest.raises(ConfigError, match="Unknown --pin 'on'.*'auto', 'off'"):
        TrainConfig(pin="on")


def test_workers_get_the_threads_the_hubs_leave():
    from nbdist.cluster.affinity import worker_threads

    assert worker_threads(2, 1, 1) == 1  # the overhead.py machine: the hub keeps a core
    assert worker_threads(16, 2, 2) == 7
    assert worker_threads(4, 0, 1) == 4  # no hub on the host: every core
    assert worker_threads(2, 1, 3) == 1  # never none


def test_a_hub_may_spin_only_where_every_hub_and_worker_on_its_host_has_a_core():
    assert affinity.may_spin(2, 1, 1)  # this machine: one core for the hub, one for the worker
    assert not affinity.may_spin(2, 1, 2)  # two workers take both cores
    assert affinity.may_spin(8, 2, 6) and not affinity.may_spin(8, 2, 7)
    assert not affinity.may_spin(4, 0, 4)  # no hub on the host: nobody to spin for
    assert not affinity.may_spin(4, 1, 0)  # a host of hubs only: its workers come over TCP


def test_spin_option_is_checked():
    assert TrainConfig().spin == "auto" and TrainConfig(spin="OFF").spin == "off"
    with pytest.raises(ConfigError, match="--spin"):
        TrainConfig(spin="always")


def test_a_host_counts_the_union_of_its_engines_cores():
    pairs = [("a", (0, 1)), ("a", (0, 1)), ("b", (0, 1)), ("b", (2, 3)), ("b", (3, 4)), ("c", ())]
    assert affinity.cores_per_host(pairs) == {"a": 2, "b": 5}  # shared, then own sets; c unknown


def test_threads_and_polling_follow_each_host_s_cores_not_this_kernel_s():
    """A 16-core node beside a 1-core one (Slurm gave each engine its own core set), whatever
    this kernel's count: the workers' threads and the hubs' polling follow the host's."""
    from nbdist.cluster.engines import Roles
    from nbdist.cluster.netaddr import HostNet
    from nbdist.modes.async_ps.backend import ClusterBackend

    b = ClusterBackend.__new__(ClusterBackend)
    b.roles = Roles((0, 2), (1, 3), {1: 0, 3: 0})
    b.worker_engines, b.spin = [1, 3], True
    b.hosts = {0: "big", 1: "big", 2: "small", 3: "small"}
    b.nets = {0: HostNet("big", "big:b", "10.0.0.1", cores=tuple(range(8))),
              1: HostNet("big", "big:b", "10.0.0.1", cores=tuple(range(8, 16))),
              2: HostNet("small", "small:b", "10.0.0.2", cores=(5,)),
              3: HostNet("small", "small:b", "10.0.0.2", cores=(5,))}
    b.cores = affinity.cores_per_host((b.hosts[e], n.cores) for e, n in b.nets.items())
    assert [b.host_cores(e) for e in range(4)] == [16, 16, 1, 1]
    assert (b.threads_for(1, 1), b.threads_for(3, 1)) == (15, 1)
    assert [b.spin_for(e, 0.005) for e in range(4)] == [0.005, 0.005, 0.0, 0.0]
    b.cores = {}  # engines that could not tell: this kernel's count
    assert b.host_cores(0) == (os.cpu_count() or 1)
