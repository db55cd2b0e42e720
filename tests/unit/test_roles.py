import pytest

from nbdist.cluster.engines import assign_roles
from nbdist.errors import NotEnoughEnginesError


def test_one_host_first_engine_serves_the_rest_train():
    r = assign_roles({0: "a", 1: "a", 2: "a"}, num_servers=1, num_workers=None)
    assert r.servers == (0,) and r.workers == (1, 2) and r.local_rank == {1: 0, 2: 1}


def test_shards_spread_over_hosts_and_local_ranks_count_per_host():
    hosts = {0: "a", 1: "a", 2: "b", 3: "b", 4: "b"}
    r = assign_roles(hosts, num_servers=2, num_workers=2)
    assert r.servers == (0, 2)
    assert r.workers == (1, 3) and r.local_rank == {1: 0, 3: 0}


def test_more_workers_than_engines_says_how_many_are_needed():
    with pytest.raises(NotEnoughEnginesError,
                       match=r"needs 1 parameter shard\(s\) and 3 worker\(s\).*has 3"):
        assign_roles({0: "a", 1: "a", 2: "a"}, num_servers=1, num_workers=3)
